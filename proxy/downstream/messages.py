"""What the endpoint notes about a client's message: the record the access log, the metrics and the
span take from one POST, and the sighting the migration report takes (downstream/clients.py)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from aiohttp import web

from ..protocol import jsonrpc
from ..tracing import NULL_DOWNSTREAM, DownstreamSpan
from .clients import Sighting
from .reply import json_response

_BYTE_SESSIONS_KEPT = 10_000  # legacy sessions of a legacy HTTP upstream whose client is known here
_LISTENING = frozenset({"resources/subscribe"})


class Record:
    """What the access log and metrics say about one POST. Its defaults are the class's: a POST
    sets only what it learns (one is made for every request, and lives only as long)."""

    error_code: object = None  # the JSON-RPC error code of an error reply
    method: Any = None
    downstream_era = "legacy"  # until the client's MCP-Protocol-Version header or its message says
    upstream_era = "unknown"
    outcome = "ok"
    status = 200
    session: str | None = None
    request_id: Any = None
    sighting: Sighting | None = None  # the client, for the migration report

    def __init__(self, span: DownstreamSpan = NULL_DOWNSTREAM) -> None:
        self.span = span  # its trace span (the null one while tracing is off)


def method_of(body: object) -> object:
    """What the access log and metrics call a POST before it is read further: its method, `batch`,
    or `response` for a client's answer to a server's request (which has none); None for a body
    that is no JSON-RPC message."""
    if isinstance(body, list):
        return "batch"
    if not isinstance(body, dict):
        return None
    method = body.get("method")
    return "response" if method is None and ("result" in body or "error" in body) else method


def error_code(message: dict[str, Any]) -> object:
    error = message.get("error")
    return error.get("code") if isinstance(error, dict) else None


def reason(exc: BaseException) -> str:
    """aiohttp's payload errors read "400, message:\n  <reason>": the reason."""
    lines = str(exc).strip().splitlines()
    return lines[-1].strip()[:200] if lines else exc.__class__.__name__


def method_not_allowed() -> web.Response:
    return json_response(
        jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Method not allowed"), 405, {"Allow": "POST"}
    )


def extension_ids(capabilities: object) -> list[str]:
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return [key for key in extensions if isinstance(key, str)] if isinstance(extensions, dict) else []


def legacy_sighting(body: Any, client_info: object, version: object) -> Sighting | None:
    """A legacy client's message (or batch) in its session; None for one plain request, which
    uses none of the features the report counts (ClientReport.seen_plain)."""
    if isinstance(body, dict):  # the usual: one message, no generator
        first: dict[str, Any] = body
        answers = "method" not in body
    else:
        items = body if isinstance(body, list) else [body]
        first = items[0] if items and isinstance(items[0], dict) else {}
        answers = any(isinstance(i, dict) and "method" not in i for i in items)
    # Read before the message is checked (the endpoint refuses it afterwards): `method` may be
    # any JSON value, an unhashable one too.
    method = first.get("method")
    name = method if isinstance(method, str) else ""
    params = first.get("params")
    task = name.startswith("tasks/") or (isinstance(params, dict) and "task" in params)
    listen = name in _LISTENING
    if not (answers or listen or task) and first is body:
        return None
    return Sighting(client_info, version, "legacy", input_round=answers, listen=listen, task=task)


class ByteSessions:
    """The clients of a legacy HTTP upstream's own sessions (relayed byte for byte): its
    initialize names a client; the session id the server handed out names it afterwards (bounded:
    the oldest sessions are forgotten)."""

    def __init__(self) -> None:
        self._clients: OrderedDict[str, tuple[object, object]] = OrderedDict()

    def sighting(self, body: Any, session_id: str | None, handed_out: str | None) -> Sighting | None:
        """The client of one message: `session_id` the one it sent, `handed_out` the server's reply's."""
        if isinstance(body, dict) and body.get("method") == "initialize":
            params = jsonrpc.params_of(body)
            client = (params.get("clientInfo"), params.get("protocolVersion"))
            if handed_out:
                self._clients[handed_out] = client
                while len(self._clients) > _BYTE_SESSIONS_KEPT:
                    self._clients.popitem(last=False)
            caps = params.get("capabilities")
            return Sighting(*client, "legacy", opened_session=True, extensions=extension_ids(caps))
        known = self._clients.get(session_id) if session_id is not None else None
        if known is None:
            return None
        self._clients.move_to_end(session_id)  # type: ignore[arg-type]
        return legacy_sighting(body, *known) or Sighting(*known, "legacy")
