"""Failures talking to the upstream, each carrying the JSON-RPC code the client will see."""

from __future__ import annotations

from ..protocol import jsonrpc


class UpstreamError(Exception):
    code = jsonrpc.UPSTREAM_UNAVAILABLE
    kind = "unavailable"  # metrics label

    def __init__(self, upstream: str, message: str) -> None:
        super().__init__(message)
        self.upstream = upstream

    @property
    def client_message(self) -> str:
        return f"upstream {self.upstream!r} {self.args[0]}"


class UpstreamUnavailable(UpstreamError):
    pass


class UpstreamTimeout(UpstreamError):
    code = jsonrpc.UPSTREAM_TIMEOUT
    kind = "timeout"


class UpstreamProtocolError(UpstreamError):
    """The upstream answered with something that is not valid MCP."""

    code = jsonrpc.UPSTREAM_INVALID
    kind = "invalid"


class UpstreamHTTPError(UpstreamError):
    """An HTTP status the proxy cannot turn into a JSON-RPC message (or must relay: 401/403)."""

    kind = "http"

    def __init__(self, upstream: str, status: int, body: str, www_authenticate: str | None) -> None:
        super().__init__(upstream, f"answered HTTP {status}: {body[:200]}")
        self.status = status
        self.body = body
        self.www_authenticate = www_authenticate

    @property
    def is_auth(self) -> bool:
        return self.status in (401, 403)


class UpstreamSessionGone(UpstreamError):
    """The legacy upstream no longer knows the session (HTTP 404 on a session request)."""

    kind = "session_gone"
