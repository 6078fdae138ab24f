"""The invariant every answer of the proxy must hold, whatever it was sent or whatever its upstream
did: a JSON-RPC reply (or SSE stream of JSON-RPC messages) with a plausible code and HTTP status,
or one of the documented empty statuses; never HTML, a traceback, a plain-text error or a hang."""

from __future__ import annotations

import json
from typing import Any

from proxy.protocol import jsonrpc
from proxy.protocol.sse import Decoder
from tests.support.raw_http_client import Reply

# Statuses the proxy answers with. 202: an accepted notification or response (no body).
ALLOWED_STATUSES = frozenset(
    {200, 202, 400, 401, 403, 404, 405, 406, 408, 409, 413, 415, 421, 429, 431, 500, 502, 503, 504}
)
EMPTY_STATUSES = frozenset({202, 204})
# Codes a client may see: JSON-RPC's reserved range (standard, MCP and the proxy's own -32010..-32013).
PLAUSIBLE_CODES = range(-32768, -31999)
# "Your message is malformed", said with a 5xx: never (400; or what the transport says more
# exactly: 405 wrong HTTP method, 413 too large, 415, 406). A 200 is allowed for -32600: an
# upstream's own -32600 reaches a legacy client in a 200 like every relayed error (status.py).
MALFORMED_CODES = frozenset({jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST})
# What the proxy answers when its own code failed: downstream/guard.py's 500, and the bridge's
# (stdio, HTTP+SSE) for a request whose handling raised. Never the right answer to anything sent.
UNHANDLED = frozenset({"Internal error", "the proxy could not serve the request", "the proxy answered HTTP 500"})
_FORBIDDEN = (b"Traceback (most recent call last)", b"<html", b"<!doctype", b"HTTP/1.1 ", b"HTTP/1.0 ")


def well_formed(message: Any) -> bool:
    """A JSON-RPC 2.0 message as MCP's schemas define one (`params: null` taken for no params, as
    the proxy takes it): an object with `jsonrpc: "2.0"`; a string `method`, object `params` and a
    string or integer `id` if any; or an answer: `result`, or an `error` object (an integer code,
    a string message), under such an id (an error's may be null). What is not is refused -32600."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return False

    def an_id(value: Any) -> bool:
        return isinstance(value, str | int) and not isinstance(value, bool)

    if "method" in message:
        params = message.get("params")
        return (
            isinstance(message["method"], str)
            and (params is None or isinstance(params, dict))
            and ("id" not in message or an_id(message["id"]))
        )
    if "error" in message:
        error = message["error"]
        code = error.get("code") if isinstance(error, dict) else None
        return (
            "result" not in message
            and isinstance(code, int)
            and not isinstance(code, bool)
            and isinstance(error.get("message"), str)
            and (message.get("id") is None or an_id(message["id"]))
        )
    return "result" in message and an_id(message.get("id"))


def problems(reply: Reply, http_method: str = "POST") -> list[str]:
    """Everything wrong with `reply` (empty when it holds the invariant). A DELETE that ended a
    session is answered 200 with no body."""
    found: list[str] = []
    if reply.status not in ALLOWED_STATUSES:
        found.append(f"unexpected HTTP status {reply.status}")
    lowered = reply.body.lower()
    for marker in _FORBIDDEN:
        if marker.lower() in lowered:
            found.append(f"body holds {marker!r}")
    if reply.trailing:
        found.append(f"bytes after the end of the reply: {reply.trailing[:80]!r}")
    if reply.status in EMPTY_STATUSES or (http_method == "DELETE" and reply.status == 200):
        if reply.body:
            found.append(f"HTTP {reply.status} with a body")
        return found
    if reply.content_type == "application/json":
        found += _json_problems(reply)
    elif reply.content_type == "text/event-stream":
        if reply.status != 200:
            found.append(f"an event stream with HTTP {reply.status}")
        found += _sse_problems(reply.body)
    else:
        found.append(
            f"HTTP {reply.status} with content type {reply.content_type!r}, not a JSON-RPC body: {reply.body[:120]!r}"
        )
    return found


def _json_problems(reply: Reply) -> list[str]:
    try:
        value = json.loads(reply.body)
    except ValueError as exc:
        return [f"body is not JSON ({exc}): {reply.body[:120]!r}"]
    messages = value if isinstance(value, list) else [value]
    if not messages:
        return ["an empty JSON array"]
    found: list[str] = []
    for message in messages:
        if jsonrpc.kind(message) != "response":
            found.append(f"not a JSON-RPC response: {str(message)[:160]}")
            continue
        error = message.get("error")
        if isinstance(error, dict):
            found += _error_problems(error, reply.status, single=not isinstance(value, list))
    if reply.status >= 500 and not any(isinstance(m, dict) and "error" in m for m in messages):
        found.append(f"HTTP {reply.status} without a JSON-RPC error")
    return found


def _error_problems(error: dict[str, Any], status: int, *, single: bool) -> list[str]:
    code = error["code"]
    found: list[str] = []
    if code not in PLAUSIBLE_CODES:
        found.append(f"implausible error code {code}")
    if single and code in MALFORMED_CODES and status >= 500:
        found.append(f"error {code} with HTTP {status}")
    if single and code == jsonrpc.PARSE_ERROR and status not in (400, 413):
        found.append(f"a parse error with HTTP {status}, not 400")
    if single and status == 200 and code == jsonrpc.INTERNAL_ERROR and "Internal" in str(error.get("message")):
        found.append("an internal error for client input")
    if code == jsonrpc.INTERNAL_ERROR and str(error.get("message")) in UNHANDLED:
        found.append(f"the proxy's answer to an error it did not handle (HTTP {status})")
    if len(str(error.get("message", ""))) > 2000:
        found.append("an error message longer than 2000 characters")
    return found


def _sse_problems(body: bytes) -> list[str]:
    found: list[str] = []
    for event in Decoder().feed(body + b"\n\n"):
        if not event.data:
            continue
        try:
            message = json.loads(event.data)
        except ValueError:
            found.append(f"an SSE event that is not JSON: {event.data[:120]!r}")
            continue
        if jsonrpc.kind(message) == "invalid":
            found.append(f"an SSE event that is not JSON-RPC: {event.data[:120]!r}")
        elif isinstance(message.get("error"), dict):
            found += _error_problems(message["error"], 200, single=False)
    return found


def assert_holds(reply: Reply, context: str = "", http_method: str = "POST") -> None:
    found = problems(reply, http_method)
    assert not found, f"{context}: {found}\nreply: HTTP {reply.status} {reply.headers}\n{reply.body[:600]!r}"
