"""The tasks the proxy hosts on Redis, beside the sessions (redis_store.py), for replicas."""

from __future__ import annotations

from typing import cast

from .redis_connection import key_hash, text
from .redis_store import RedisSessionStore


class RedisTaskStore:
    """The tasks the proxy hosts (task_records.TaskStore), on the sessions' Redis: one key per task
    with the task's retention as its TTL, and one sorted set per caller of its task ids by creation
    time, for tasks/list and the per-caller bound. Keys hold hashes of the caller and the id; the
    records (results: client data) are sealed, bound to their key. Shares the session store's
    client, deadline and breaker, so Redis down fails a task request with StoreUnavailable."""

    shared = True

    def __init__(self, sessions: RedisSessionStore) -> None:
        self._calls = sessions.calls
        self._client = sessions.client
        self._prefix = sessions._prefix
        self._sealer = sessions._sealer

    async def put(self, principal: str, task_id: str, record: bytes, created_at: float, ttl_s: float) -> None:
        key = self._key(principal, task_id)
        index = self._index(principal)
        ttl_ms = max(int(ttl_s * 1000), 1)
        sealed = self._sealer.seal("sto", record, key.encode())
        pipe = self._client.pipeline(transaction=False)
        pipe.set(key, sealed, px=ttl_ms)
        pipe.zadd(index, {task_id: created_at})
        # The index lives as long as its longest-lived task: set when it has no TTL, else extended.
        pipe.pexpire(index, ttl_ms, nx=True)
        pipe.pexpire(index, ttl_ms, gt=True)
        await self._calls("task", pipe.execute())

    async def get(self, principal: str, task_id: str) -> bytes | None:
        key = self._key(principal, task_id)
        sealed = await self._calls("task", self._client.get(key))
        return self._sealer.open("sto", text(sealed), key.encode()) if sealed else None

    async def page(self, principal: str, after: tuple[float, str] | None, limit: int) -> list[bytes]:
        index = self._index(principal)
        low = after[0] if after is not None else "-inf"
        # Ties on the creation time come back in the order of their ids, the order pages follow.
        found_entries = await self._calls(
            "task", self._client.zrange(index, low, "+inf", byscore=True, withscores=True)
        )
        entries = cast("list[tuple[bytes, float]]", found_entries)  # redis-py types replies loosely
        ids = [text(member) for member, score in entries if after is None or (score, text(member)) > after]
        found: list[bytes] = []
        for start in range(0, len(ids), limit):
            batch = ids[start : start + limit]
            found.extend(await self._records(principal, batch))
            if len(found) >= limit:
                break
        return found[:limit]

    async def count(self, principal: str) -> int:
        ids = cast("list[bytes]", await self._calls("task", self._client.zrange(self._index(principal), 0, -1)))
        return len(await self._records(principal, [text(member) for member in ids]))

    async def remove(self, principal: str, task_id: str) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self._key(principal, task_id))
        pipe.zrem(self._index(principal), task_id)
        await self._calls("task", pipe.execute())

    async def _records(self, principal: str, ids: list[str]) -> list[bytes]:
        """The live records of `ids`, in order; the ids whose record expired leave the index."""
        if not ids:
            return []
        keys = [self._key(principal, task_id) for task_id in ids]
        values = await self._calls("task", self._client.mget(keys))
        records: list[bytes] = []
        gone: list[str] = []
        for task_id, key, sealed in zip(ids, keys, values, strict=True):
            opened = self._sealer.open("sto", text(sealed), key.encode()) if sealed else None
            if opened is None:
                gone.append(task_id)
            else:
                records.append(opened)
        if gone:
            await self._calls("task", self._client.zrem(self._index(principal), *gone))
        return records

    def _index(self, principal: str) -> str:
        return f"{self._prefix}{{t{key_hash(principal)}}}:tasks"

    def _key(self, principal: str, task_id: str) -> str:
        return f"{self._prefix}{{t{key_hash(principal)}}}:task:{key_hash(task_id)}"
