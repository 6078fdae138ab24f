"""Structured logging: one JSON object per line on stderr (stdout may carry MCP over stdio)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import orjson
import structlog


def _dumps(event: dict[str, Any], **_: Any) -> bytes:
    """orjson where it can (a line per request at the info level: it is on the hot path), the
    standard library where it cannot (integers beyond 64 bits, text that is not valid Unicode such
    as a header's undecodable bytes); anything else as its repr. A log line never fails to write:
    a lone surrogate becomes its JSON escape."""
    try:
        return orjson.dumps(event, default=repr)
    except TypeError:
        text = json.dumps(event, default=repr, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace")


def _dumps_text(event: dict[str, Any], **_: Any) -> str:
    return _dumps(event).decode()


class _Worker:
    """Adds `worker: <index>` to every event."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __call__(self, logger: Any, name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["worker"] = self._index
        return event


def configure_logging(
    level: str = "info", fmt: str = "json", worker: int | None = None, file: str | None = None
) -> None:
    """`worker`: the index of this process under --workers, put on every line it writes; `file`:
    logs are appended there instead of stderr (never stdout: it may carry MCP over stdio)."""
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        structlog.processors.format_exc_info,
    ]
    if worker is not None:
        processors.insert(1, _Worker(worker))
    factory: Any
    stream: Any = sys.stderr if file is None else open(file, "a", buffering=1, encoding="utf-8")
    binary = getattr(stream, "buffer", None)  # absent when stderr is replaced (tests)
    if file is None and fmt == "json" and binary is not None:
        processors.append(structlog.processors.JSONRenderer(serializer=_dumps))
        factory = structlog.BytesLoggerFactory(file=binary)
    elif fmt == "json":
        processors.append(structlog.processors.JSONRenderer(serializer=_dumps_text))
        factory = structlog.PrintLoggerFactory(file=stream)
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory = structlog.PrintLoggerFactory(file=stream)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
