"""Errors the relay turns into JSON-RPC error replies, with the HTTP status to use."""

from __future__ import annotations

from typing import Any

from .protocol import jsonrpc


class ProxyError(Exception):
    """A request the proxy answers with a JSON-RPC error.

    `status` is the HTTP status when the error is the whole reply; errors inside an open SSE
    stream can only be JSON-RPC. `headers` are added to the HTTP reply (e.g. WWW-Authenticate).
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        status: int = 200,
        data: Any = None,
        headers: dict[str, str] | None = None,
        outcome: str = "error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.data = data
        self.headers = headers or {}
        self.outcome = outcome

    def reply(self, request_id: jsonrpc.RequestId | None) -> dict[str, Any]:
        return jsonrpc.error_response(request_id, self.code, self.message, self.data)


SESSION_NOT_FOUND = -32001  # what the reference SDKs send with HTTP 404 for an unknown session


def session_not_found() -> ProxyError:
    return ProxyError(SESSION_NOT_FOUND, "Session not found", status=404, outcome="rejected")
