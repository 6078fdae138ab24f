"""Errors the proxy answers with a JSON-RPC error reply, and the HTTP status to send it with."""

from __future__ import annotations

from typing import Any

from .protocol import jsonrpc
from .protocol.status import Rejection, http_status
from .protocol.versions import Era


class ProxyError(Exception):
    """A request the proxy answers with a JSON-RPC error.

    The HTTP status (when the error is the whole reply; inside an open SSE stream only JSON-RPC
    remains) comes from protocol.status for the client's era, unless `status` fixes one for a
    transport condition (unknown session, body too large, relayed 401). `refused`: the proxy turned
    the request down before running it. `headers` are added to the HTTP reply (WWW-Authenticate).
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        status: int | None = None,
        refused: bool = False,
        data: Any = None,
        headers: dict[str, str] | None = None,
        outcome: str = "error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.refused = refused
        self.data = data
        self.headers = headers or {}
        self.outcome = outcome

    @classmethod
    def rejected(cls, rejection: Rejection) -> ProxyError:
        return cls(rejection.code, rejection.message, status=rejection.status, data=rejection.data, outcome="rejected")

    def status_for(self, era: Era) -> int:
        return self.status if self.status is not None else http_status(self.code, era, refused=self.refused)

    def reply(self, request_id: jsonrpc.RequestId | None) -> dict[str, Any]:
        return jsonrpc.error_response(request_id, self.code, self.message, self.data)


SESSION_NOT_FOUND = -32001  # what the reference SDKs send with HTTP 404 for an unknown session


def session_not_found() -> ProxyError:
    return ProxyError(SESSION_NOT_FOUND, "Session not found", status=404, outcome="rejected")
