"""Counts the hostile-input, fault, soak and replica suites report at the end of a run (tests/conftest.py
prints them): how many inputs were tried, faults injected, what the soak and the replicas measured."""

from __future__ import annotations

from collections import Counter
from typing import Any

COUNTS: Counter[str] = Counter()
NOTES: list[str] = []
# The replica suite's one summary line, by group, in this order (tests/replicas).
REPLICA_GROUPS = ("spread", "steady", "conformance", "kills", "redis restart", "rolling", "tamper")
REPLICAS: dict[str, list[str]] = {}


def count(key: str, n: int = 1) -> None:
    COUNTS[key] += n


def note(line: str) -> None:
    NOTES.append(line)


def replicas(group: str, text: str, *, append: bool = False) -> None:
    """What a replica test measured, for its group of the summary line (replacing what was there,
    or after it with `append`)."""
    parts = REPLICAS.setdefault(group, [])
    if not append:
        parts.clear()
    parts.append(text)


def dump() -> dict[str, Any]:
    """What this process tallied, as plain data (an xdist worker sends it to the controller)."""
    return {"counts": dict(COUNTS), "notes": list(NOTES), "replicas": {k: list(v) for k, v in REPLICAS.items()}}


def merge(dumped: dict[str, Any]) -> None:
    """Add another process's `dump` to this one's tally."""
    COUNTS.update(dumped["counts"])
    NOTES.extend(dumped["notes"])
    for group, parts in dumped["replicas"].items():
        REPLICAS.setdefault(group, []).extend(parts)
