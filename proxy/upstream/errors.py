"""Failures talking to the upstream, each carrying the JSON-RPC code the client will see."""

from __future__ import annotations

from ..protocol import jsonrpc
from ..protocol.outcome import UpstreamFailure
from ..protocol.relayed_reply import excerpt


class UpstreamError(Exception):
    code = jsonrpc.UPSTREAM_UNAVAILABLE
    kind = "unavailable"  # metrics label

    def __init__(self, upstream: str, message: str) -> None:
        super().__init__(message)
        self.upstream = upstream

    @property
    def client_message(self) -> str:
        return self.failure.message

    @property
    def failure(self) -> UpstreamFailure:
        """This failure as plain data, for the core and the one place that tells the client."""
        return UpstreamFailure(self.upstream, self.kind, self.code, str(self.args[0]))


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

    def __init__(self, upstream: str, status: int, body: bytes | str, www_authenticate: str | None) -> None:
        quoted = excerpt(body)  # a page's title, not the page
        super().__init__(upstream, f"answered HTTP {status}: {quoted}" if quoted else f"answered HTTP {status}")
        self.status = status
        self.body = quoted
        self.www_authenticate = www_authenticate

    @property
    def failure(self) -> UpstreamFailure:
        return UpstreamFailure(
            self.upstream, self.kind, self.code, str(self.args[0]), self.status, self.www_authenticate
        )


class UpstreamSessionGone(UpstreamError):
    """The legacy upstream no longer knows the session (HTTP 404 on a session request)."""

    kind = "session_gone"
