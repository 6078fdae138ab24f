"""Counts the hostile-input, fault and soak suites report at the end of a run (tests/conftest.py
prints them): how many inputs were tried, faults injected, and what the soak measured."""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()
NOTES: list[str] = []


def count(key: str, n: int = 1) -> None:
    COUNTS[key] += n


def note(line: str) -> None:
    NOTES.append(line)
