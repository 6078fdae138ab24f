"""Reserved `_meta` keys and the logging level order."""

from __future__ import annotations

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
