"""The HTTP status of a JSON-RPC error reply: one table every path consults, and `Rejection`.

Modern clients (2026-07-28/basic/transports/streamable-http.mdx §Protocol Version Header, §Server
Validation): the spec fixes 400 for a header mismatch, an unsupported version and a missing client
capability, 404 for an unknown method. A message that is not JSON or not JSON-RPC is refused with
400 in both eras. Invalid params get 400 only when the proxy refuses the request before running it
(its envelope, an invalid `requestState`); the same code from running it (a tool's arguments)
travels in a 200 like every other error the spec leaves open (docs/translation.md §4.7, §8.14).

Legacy clients (2025-11-25/basic/transports.mdx): JSON-RPC errors travel in a 200; HTTP error
statuses are for the transport (unknown session, body too large), which the caller sets itself.
In particular an upstream -32601 never becomes a 404, which a legacy client reads as "session gone".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import jsonrpc
from .versions import Era

_MODERN = {
    jsonrpc.PARSE_ERROR: 400,
    jsonrpc.INVALID_REQUEST: 400,
    jsonrpc.METHOD_NOT_FOUND: 404,
    jsonrpc.HEADER_MISMATCH: 400,
    jsonrpc.MISSING_REQUIRED_CAPABILITY: 400,
    jsonrpc.UNSUPPORTED_PROTOCOL_VERSION: 400,
}
# What a refusal of the message itself (not of its params) is, whoever refuses it.
_MALFORMED = frozenset({jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST})


def http_status(code: object, era: Era, *, refused: bool = False) -> int:
    """The status for an error with `code` sent to a client of `era`.

    `refused`: the proxy turned the request down before running it (validation), rather than
    relaying what running it produced.
    """
    if era is Era.MODERN:
        status = _MODERN.get(code) if isinstance(code, int) else None
        if status is not None:
            return status
        return 400 if refused and code == jsonrpc.INVALID_PARAMS else 200
    return 400 if refused and code in _MALFORMED else 200


def status_of(message: jsonrpc.JSONDict, era: Era) -> int:
    """The status of a whole reply relayed to a client of `era` (200 for a result)."""
    error = message.get("error")
    return http_status(error.get("code"), era) if isinstance(error, dict) else 200


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request turned down before it ran, by a classification or validation ladder."""

    code: int
    message: str
    data: Any = None

    @property
    def status(self) -> int:
        # Ladders answer both eras alike; only a modern client ever gets a 404 from one.
        return http_status(self.code, Era.MODERN, refused=True)

    def reply(self, request_id: jsonrpc.RequestId | None) -> jsonrpc.JSONDict:
        return jsonrpc.error_response(request_id, self.code, self.message, self.data)
