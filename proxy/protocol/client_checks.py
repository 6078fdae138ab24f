"""What the proxy refuses in any client message, whatever the route, before anything reads it further.

The relays hash, key, encode and mirror into headers what a client sends; these checks keep that
input within what every later step can handle, so that hostile input gets a clear 400 instead of
an internal error or a call that never ends (docs/translation.md §7.24). Pure: decoded JSON in,
a Rejection (or None) out.
"""

from __future__ import annotations

import re
from typing import Any

from . import jsonrpc
from .headers import NAME_BEARING_METHODS
from .status import Rejection

# Policy: deep enough for any real tool argument or schema, shallow enough that whatever the proxy
# builds around client JSON stays within orjson's limit of 254 levels when it writes it again.
DEFAULT_MAX_DEPTH = 64
MAX_DEPTH_LIMIT = 200

# C0 controls and DEL: an HTTP header cannot carry them, and a method name is mirrored into one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Request fields that name something (a tool, a prompt, a resource): the relays look them up,
# key by them and mirror them into Mcp-Name, so they must be strings (both eras' schemas say so).
# (A task id is checked where tasks are served: it names nothing the relays look up or key by.)
_NAME_FIELDS = {
    **{method: name for method, name in NAME_BEARING_METHODS.items() if not method.startswith("tasks/")},
    "resources/subscribe": "uri",
    "resources/unsubscribe": "uri",
}


def too_deep(value: Any, limit: int, raw: bytes | None = None) -> bool:
    """Whether `value` nests arrays and objects more than `limit` levels deep (the outermost
    counts as one). `raw`, the bytes it was decoded from, skips the walk when they hold too few
    brackets to nest that deep, as almost every message does. Iterative: no recursion limit."""
    if raw is not None and raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for container in level:
            for child in container.values() if isinstance(container, dict) else container:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level = below
    return False


def depth_rejection(limit: int) -> Rejection:
    return Rejection(jsonrpc.INVALID_REQUEST, f"Invalid Request: JSON nested deeper than {limit} levels")


def message_problem(message: jsonrpc.JSONDict) -> Rejection | None:
    """What makes one request or notification (its kind already checked) unfit to be relayed."""
    method = message.get("method")
    if not isinstance(method, str):
        return None  # a response: its fields are the server's business
    # A method that names something is a known one, plain text: no control character to look for.
    field = _NAME_FIELDS.get(method)
    if field is None and not (method.isascii() and method.isprintable()) and _CONTROL.search(method) is not None:
        return Rejection(jsonrpc.INVALID_REQUEST, "Invalid Request: the method name holds a control character")
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    if field is not None:
        if field in params and not isinstance(params[field], str):
            return Rejection(jsonrpc.INVALID_PARAMS, f"Invalid params: {field} must be a string")
    elif method == "notifications/cancelled" and "requestId" in params:
        if not jsonrpc.is_request_id(params["requestId"]):
            return Rejection(jsonrpc.INVALID_PARAMS, "Invalid params: requestId must be a string or an integer")
    return None
