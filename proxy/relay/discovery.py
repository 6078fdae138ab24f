"""The upstream's `server/discover` result, fetched on demand and kept while fresh.

Freshness follows the result's own `ttlMs`; `private` results are kept per caller.
(The general response cache of later work supersedes this for list results.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

JSONDict = dict[str, Any]
_MAX_TTL_S = 300.0


class DiscoverCache:
    def __init__(
        self, fetch: Callable[[str], Awaitable[JSONDict]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fetch = fetch  # principal -> DiscoverResult
        self._clock = clock
        self._entries: dict[str, tuple[float, JSONDict]] = {}
        self._inflight: dict[str, asyncio.Future[JSONDict]] = {}

    async def get(self, principal: str) -> JSONDict:
        now = self._clock()
        for key in ("", principal) if principal else ("",):
            entry = self._entries.get(key)
            if entry is not None and entry[0] > now and (key == principal or entry[1].get("cacheScope") == "public"):
                return entry[1]
        pending = self._inflight.get(principal)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[JSONDict] = asyncio.get_running_loop().create_future()
        self._inflight[principal] = future
        try:
            result = await self._fetch(principal)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: concurrent waiters re-raise it themselves
            raise
        finally:
            self._inflight.pop(principal, None)
        future.set_result(result)
        ttl_ms = result.get("ttlMs")
        if isinstance(ttl_ms, int) and not isinstance(ttl_ms, bool) and ttl_ms > 0:
            key = "" if result.get("cacheScope") == "public" else principal
            self._entries[key] = (now + min(ttl_ms / 1000, _MAX_TTL_S), result)
        return result

    def invalidate(self) -> None:
        self._entries.clear()
