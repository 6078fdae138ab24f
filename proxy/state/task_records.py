"""Where the tasks the proxy hosts are kept: the task store interface and its in-memory form.

A task is keyed by its caller's principal and its id, never by a session, so it outlives the
session that made it; with a shared store (state/redis_tasks.py RedisTaskStore) every replica sees it.
Records are opaque bytes here (protocol.legacy_tasks.TaskRecord encodes them); the relay seals them
before they leave the process, bound to their caller and id.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from typing import Protocol


class TaskStore(Protocol):
    """Safe for concurrent coroutines. A record expires by itself `ttl_s` after it was put (the
    task's retention); raises sessions.StoreUnavailable when a shared store cannot answer."""

    shared: bool

    async def put(self, principal: str, task_id: str, record: bytes, created_at: float, ttl_s: float) -> None:
        """Keep (or replace) one task's record."""

    async def get(self, principal: str, task_id: str) -> bytes | None:
        """The record, or None: never kept, expired or removed."""

    async def page(self, principal: str, after: tuple[float, str] | None, limit: int) -> list[bytes]:
        """Up to `limit` of the caller's live records, ordered by (created_at, task_id), those after
        `after` only."""

    async def count(self, principal: str) -> int:
        """The caller's live records."""

    async def remove(self, principal: str, task_id: str) -> None:
        """Forget the record (nothing happens if it is not kept)."""


class InMemoryTaskStore:
    """The default store: dicts in this process (one replica)."""

    shared = False

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # principal -> task id -> (record, created_at, expires_at); and each principal's ids in order.
        self._records: dict[str, dict[str, tuple[bytes, float, float]]] = {}
        self._order: dict[str, list[tuple[float, str]]] = {}
        self._expiries: list[tuple[float, str, str]] = []  # (expires_at, principal, task id), a heap

    async def put(self, principal: str, task_id: str, record: bytes, created_at: float, ttl_s: float) -> None:
        self._expire()
        records = self._records.setdefault(principal, {})
        if task_id not in records:
            bisect.insort(self._order.setdefault(principal, []), (created_at, task_id))
        expires_at = self._clock() + ttl_s
        previous = records.get(task_id)
        records[task_id] = (record, created_at, expires_at)
        if previous is None or previous[2] != expires_at:
            heapq.heappush(self._expiries, (expires_at, principal, task_id))

    async def get(self, principal: str, task_id: str) -> bytes | None:
        self._expire()
        entry = self._records.get(principal, {}).get(task_id)
        return entry[0] if entry is not None else None

    async def page(self, principal: str, after: tuple[float, str] | None, limit: int) -> list[bytes]:
        self._expire()
        order = self._order.get(principal, [])
        start = bisect.bisect_right(order, after) if after is not None else 0
        records = self._records.get(principal, {})
        return [records[task_id][0] for _, task_id in order[start : start + limit]]

    async def count(self, principal: str) -> int:
        self._expire()
        return len(self._records.get(principal, {}))

    async def remove(self, principal: str, task_id: str) -> None:
        entry = self._records.get(principal, {}).pop(task_id, None)
        if entry is not None:
            self._order[principal].remove((entry[1], task_id))
        self._drop_if_empty(principal)

    def _expire(self) -> None:
        """Drop every record past its retention, soonest first (a heap: no scan of the rest)."""
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            expires_at, principal, task_id = heapq.heappop(self._expiries)
            entry = self._records.get(principal, {}).get(task_id)
            if entry is not None and entry[2] == expires_at:  # not put again with a later expiry
                del self._records[principal][task_id]
                self._order[principal].remove((entry[1], task_id))
                self._drop_if_empty(principal)

    def _drop_if_empty(self, principal: str) -> None:
        if principal in self._records and not self._records[principal]:
            del self._records[principal]
            self._order.pop(principal, None)
