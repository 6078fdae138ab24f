"""Reserved `_meta` keys and the logging level order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "io.modelcontextprotocol/"
PROTOCOL_VERSION = PREFIX + "protocolVersion"
CLIENT_CAPABILITIES = PREFIX + "clientCapabilities"
CLIENT_INFO = PREFIX + "clientInfo"
LOG_LEVEL = PREFIX + "logLevel"
SERVER_INFO = PREFIX + "serverInfo"
SUBSCRIPTION_ID = PREFIX + "subscriptionId"
RELATED_TASK = PREFIX + "related-task"

ENVELOPE_KEYS = (PROTOCOL_VERSION, CLIENT_CAPABILITIES, CLIENT_INFO, LOG_LEVEL)

# Least to most severe (RFC 5424 order as used by MCP).
LOG_LEVELS: tuple[str, ...] = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
_LEVEL_RANK = {level: rank for rank, level in enumerate(LOG_LEVELS)}


def level_passes(level: object, threshold: str | None) -> bool:
    """Whether a log message at `level` reaches a receiver that asked for `threshold`."""
    if threshold is None:
        return False
    rank = _LEVEL_RANK.get(level) if isinstance(level, str) else None
    # Unknown levels are let through rather than silently dropped.
    return rank is None or rank >= _LEVEL_RANK[threshold]


def meta_of(params: object) -> dict[str, Any] | None:
    if isinstance(params, dict):
        meta = params.get("_meta")
        if isinstance(meta, dict):
            return meta
    return None


def with_meta(params: object, key: str, value: Any) -> dict[str, Any]:
    """A copy of `params` (or of a result) whose `_meta` also holds `key`; the rest kept as it was."""
    base = params if isinstance(params, dict) else {}
    return {**base, "_meta": {**(meta_of(base) or {}), key: value}}


# W3C trace context: carried in HTTP headers and, where there are none (stdio) or a server reads
# it there, in the request `_meta` under the same names.
TRACE_KEYS = ("traceparent", "tracestate", "baggage")
TRACE_KEYS_SET = frozenset(TRACE_KEYS)


def trace_of(headers: Mapping[str, str]) -> dict[str, str]:
    """The trace context among `headers` (it belongs to one request)."""
    if not headers:  # a caller without credentials or trace context: no comprehension to run
        return {}
    return {k: v for k, v in headers.items() if k.lower() in TRACE_KEYS_SET}


def without_trace(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` but the trace context: what goes on with a session or a task beyond one request."""
    if not headers:
        return {}
    return {k: v for k, v in headers.items() if k.lower() not in TRACE_KEYS_SET}


def carry_trace(message: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """Copy trace context between the request's `_meta` and `headers` (both directions, in place for
    `headers`); returns the message, copied if its `_meta` gained keys."""
    params = message.get("params")
    if not headers:  # nothing to add to `_meta`: only what it carries, if any, goes to headers
        carried = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(carried, dict) and not TRACE_KEYS_SET.isdisjoint(carried):
            for key in TRACE_KEYS:
                value = carried.get(key)
                if isinstance(value, str):
                    headers[key] = value
        return message
    request_meta = meta_of(params) or {}
    lowered = {name.lower(): name for name in headers}
    missing_in_meta = {key: headers[lowered[key]] for key in TRACE_KEYS if key in lowered and key not in request_meta}
    for key in TRACE_KEYS:
        value = request_meta.get(key)
        if isinstance(value, str) and key not in lowered:
            headers[key] = value
    if not missing_in_meta:
        return message
    new_params = dict(params) if isinstance(params, dict) else {}
    new_params["_meta"] = {**request_meta, **missing_in_meta}
    return {**message, "params": new_params}
