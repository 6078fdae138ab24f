"""Downstream classification: which era speaks in one HTTP POST (docs/translation.md §1.1).

An ordered ladder; the first rung that matches decides. Pure: it sees the decoded body and
the two headers that matter, never a socket.
"""

from __future__ import annotations

from enum import Enum

from . import jsonrpc, meta
from .status import Rejection
from .versions import MODERN_VERSIONS


class Route(Enum):
    LEGACY_BATCH = "legacy_batch"
    LEGACY_INITIALIZE = "legacy_initialize"
    MODERN = "modern"
    LEGACY_SESSION = "legacy_session"
    # No session and no `_meta`: only a legacy HTTP upstream relayed byte for byte can take it (a
    # server that hands out no session id); everywhere else it is SESSIONLESS.
    LEGACY_SESSIONLESS = "legacy_sessionless"


_PROTOCOL_VERSION = meta.PROTOCOL_VERSION

SESSIONLESS = Rejection(
    jsonrpc.INVALID_REQUEST,
    "no Mcp-Session-Id: send initialize first (legacy) or per-request _meta (2026-07-28)",
)


def classify_post(body: object, session_id: str | None, protocol_version_header: str | None) -> Route | Rejection:
    if isinstance(body, list):
        if not body:
            return Rejection(jsonrpc.INVALID_REQUEST, "empty batch")
        if session_id is None:
            return Rejection(jsonrpc.INVALID_REQUEST, "batch outside a session")
        return Route.LEGACY_BATCH
    if not isinstance(body, dict):
        return Rejection(jsonrpc.INVALID_REQUEST, "body is not a JSON-RPC message")
    # The reserved protocolVersion key marks a modern request even for `initialize` (a removed
    # method a modern server answers with -32601); legacy clients never set it.
    params = body.get("params")  # meta.meta_of, inlined: it runs for every POST
    if isinstance(params, dict):
        request_meta = params.get("_meta")
        if isinstance(request_meta, dict) and _PROTOCOL_VERSION in request_meta:
            return Route.MODERN
    if body.get("method") == "initialize":
        if protocol_version_header in MODERN_VERSIONS:
            return _missing_meta(protocol_version_header)
        return Route.LEGACY_INITIALIZE
    if session_id is not None:
        return Route.LEGACY_SESSION
    if protocol_version_header in MODERN_VERSIONS:
        if jsonrpc.kind(body) != "request":
            return Route.MODERN  # a modern notification carries no _meta envelope; its handler decides
        return _missing_meta(protocol_version_header)
    return Route.LEGACY_SESSIONLESS


def _missing_meta(version: str) -> Rejection:
    return Rejection(jsonrpc.INVALID_PARAMS, f"missing params._meta[{meta.PROTOCOL_VERSION!r}] required by {version}")
