"""Response cache for results the spec marks cacheable (2026-07-28/server/utilities/caching.mdx).

Entries hold the modern-shaped result as the upstream (or, for a legacy upstream, the proxy)
produced it, fresh for `ttlMs` from receipt. `public` entries are shared by every caller;
`private` ones are keyed by the caller's authorization context and never served to another.
A hit is served with the remaining freshness as `ttlMs`, so caches further down do not extend it.
Concurrent misses for one key make one upstream call. Memory is bounded by entries and bytes (LRU).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..config import CacheConfig
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..protocol.methods import CACHEABLE_METHODS, uri_within
from ..protocol.outcome import Outcome

JSONDict = dict[str, Any]
# What each notification makes stale (docs/translation.md §5 Invalidation; templates follow the resource list).
_INVALIDATES = {
    "notifications/tools/list_changed": ("tools/list",),
    "notifications/prompts/list_changed": ("prompts/list",),
    "notifications/resources/list_changed": ("resources/list", "resources/templates/list"),
}
_PUBLIC = ""  # the principal slot of a shared entry
_AUTHORIZATION_WINDOW_S = 300.0  # how long an upstream answer vouches for its caller


def request_key(method: str, params: object, protocol_version: str, capabilities: object | None) -> tuple[Any, ...]:
    """What the result depends on: the method, its parameters (cursor, uri, ... but not `_meta`, whose
    progress token and trace keys change per call), the protocol version and, optionally, the client
    capabilities (docs/translation.md §5 Key)."""
    salient = {k: v for k, v in params.items() if k != "_meta"} if isinstance(params, dict) else {}
    caps = jsonrpc.canonical(capabilities) if capabilities is not None else b""
    return (method, jsonrpc.canonical(salient), protocol_version, caps)


def resource_uri(key: tuple[Any, ...]) -> str | None:
    if key[0] != "resources/read":
        return None
    uri = jsonrpc.decode(key[1]).get("uri")
    return uri if isinstance(uri, str) else None


@dataclass(slots=True)
class _Entry:
    result: JSONDict
    size: int
    expires: float
    scope: str
    open: bool  # fetched without credentials: the upstream serves anyone
    uri: str | None  # of a resources/read entry, parsed once for invalidation and watching


class ResponseCache:
    def __init__(
        self,
        config: CacheConfig,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_store: Callable[[str | None], None] = lambda uri: None,
    ) -> None:
        """`on_store(uri)`: called when an entry is stored (e.g. watch the entry's resource URI)."""
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[tuple[Any, ...], tuple[asyncio.Future[Outcome], str]] = {}  # key -> (flight, caller)
        # Callers the upstream served lately: a public entry is served only to them, so the cache
        # never answers someone the upstream would refuse (caching.mdx §Security).
        self._authorized: OrderedDict[str, float] = OrderedDict()
        self._on_store = on_store

    @property
    def enabled(self) -> bool:
        return self._config.enabled and self._config.max_ttl_ms > 0

    def __len__(self) -> int:
        return len(self._entries)

    def key_for(
        self, method: str, params: object, protocol_version: str, capabilities: object
    ) -> tuple[Any, ...] | None:
        """The key of a request whose result may be cached, or None (a method never cached, cache off)."""
        if method not in CACHEABLE_METHODS or not self.enabled:
            return None
        return request_key(method, params, protocol_version, capabilities if self._config.capabilities_in_key else None)

    # ------------------------------------------------------------ lookups

    def lookup(self, key: tuple[Any, ...], principal: str) -> JSONDict | None:
        """A fresh result for this caller (public first, then the caller's own), with its remaining ttlMs."""
        now = self._clock()
        for slot in (_PUBLIC, principal) if principal != _PUBLIC else (_PUBLIC,):
            entry = self._entries.get((*key, slot))
            if entry is None:
                continue
            if entry.expires <= now:
                self._drop((*key, slot), "expired")
                continue
            if slot == _PUBLIC and (entry.scope != "public" or not (entry.open or self._is_authorized(principal, now))):
                continue
            self._entries.move_to_end((*key, slot))
            self._metrics.cache_requests.labels("hit", entry.scope).inc()
            return {**entry.result, "ttlMs": max(0, int((entry.expires - now) * 1000))}
        return None

    async def fetch(self, key: tuple[Any, ...], principal: str, load: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """The outcome for `key`: from memory when fresh, else from `load()` (one call for concurrent
        misses), stored when cacheable. Only the `result` of the message is shared (the caller sets
        its own id). An outcome that is not `shareable` (a result that took the client's own input)
        is neither kept nor handed to concurrent callers.
        """
        hit = self.lookup(key, principal)
        if hit is not None:
            return Outcome({"jsonrpc": "2.0", "result": hit})
        flight = self._inflight.get(key)
        if flight is not None:
            future, loader = flight
            if loader in (principal, _PUBLIC) or self._is_authorized(principal, self._clock()):
                try:
                    shared: Outcome | None = await asyncio.shield(future)
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if not future.cancelled() or (current is not None and current.cancelling()):
                        raise
                    shared = None  # that caller went away: load for ourselves
                if shared is not None and self._shareable(shared, same_caller=loader == principal):
                    self._metrics.cache_requests.labels("shared", _scope_of(shared.message)).inc()
                    return shared
        future = asyncio.get_running_loop().create_future()
        self._inflight.setdefault(key, (future, principal))
        try:
            outcome = await load()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: concurrent waiters re-raise it themselves
            raise
        finally:
            if self._inflight.get(key, (None,))[0] is future:
                del self._inflight[key]
        future.set_result(outcome)
        if not outcome.shareable:
            return outcome
        self._authorize(principal)
        self._metrics.cache_requests.labels("miss", _scope_of(outcome.message)).inc()
        self.store(key, principal, outcome.message)
        return outcome

    @staticmethod
    def _shareable(outcome: Outcome, *, same_caller: bool) -> bool:
        if not outcome.shareable:
            return False
        result = outcome.message.get("result")
        if isinstance(result, dict) and result.get("resultType") == "input_required":
            return False  # its requestState belongs to that call alone
        return same_caller or (isinstance(result, dict) and result.get("cacheScope") == "public")

    def store(self, key: tuple[Any, ...], principal: str, message: JSONDict) -> None:
        """Keep a complete result whose hints allow it; never errors or input_required results."""
        result = message.get("result")
        if not self.enabled or not isinstance(result, dict) or result.get("resultType", "complete") != "complete":
            return
        ttl_ms, scope = result.get("ttlMs"), result.get("cacheScope")
        if not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or ttl_ms <= 0 or scope not in ("public", "private"):
            return
        ttl_ms = min(ttl_ms, self._config.max_ttl_ms)
        size = len(jsonrpc.encode(result))
        if size > self._config.max_bytes:
            return
        slot = (*key, _PUBLIC if scope == "public" else principal)
        if slot in self._entries:
            self._drop(slot, None)
        uri = resource_uri(key)
        self._entries[slot] = _Entry(result, size, self._clock() + ttl_ms / 1000, scope, principal == _PUBLIC, uri)
        self._bytes += size
        while len(self._entries) > self._config.max_entries or self._bytes > self._config.max_bytes:
            self._drop(next(iter(self._entries)), "lru")
        self._gauges()
        self._on_store(uri)

    def _authorize(self, principal: str) -> None:
        self._authorized[principal] = self._clock()
        self._authorized.move_to_end(principal)
        while len(self._authorized) > self._config.max_entries:
            self._authorized.popitem(last=False)

    def _is_authorized(self, principal: str, now: float) -> bool:
        seen = self._authorized.get(principal)
        return seen is not None and now - seen < _AUTHORIZATION_WINDOW_S

    # ------------------------------------------------------------ invalidation

    def invalidate_for(self, notification: JSONDict) -> int:
        """Drop what a list_changed / resources/updated notification makes stale; returns how many."""
        method = notification.get("method")
        if method == "notifications/resources/updated":
            params = jsonrpc.params_of(notification)
            uri = params.get("uri")
            if not isinstance(uri, str):
                return 0
            # Also the resources below it (docs/translation.md §5, conservative).
            return self._invalidate(
                lambda slot, entry: entry.uri is not None and uri_within(entry.uri, uri), "resources_updated"
            )
        methods = _INVALIDATES.get(method)  # type: ignore[arg-type]
        if methods is None:
            return 0
        return self._invalidate(lambda slot, entry: slot[0] in methods, "list_changed")

    def clear(self, reason: str) -> int:
        return self._invalidate(lambda slot, entry: True, reason)

    def watched_uris(self) -> list[str]:
        return sorted({entry.uri for entry in self._entries.values() if entry.uri is not None})

    def _invalidate(self, matches: Callable[[tuple[Any, ...], _Entry], bool], reason: str) -> int:
        stale = [(slot, entry) for slot, entry in self._entries.items() if matches(slot, entry)]
        for slot, entry in stale:
            self._metrics.cache_invalidations.labels(entry.scope, reason).inc()
            self._drop(slot, None)  # updates the gauges
        return len(stale)

    def _drop(self, slot: tuple[Any, ...], eviction: str | None) -> None:
        entry = self._entries.pop(slot)
        self._bytes -= entry.size
        if eviction is not None:
            self._metrics.cache_evictions.labels(eviction, entry.scope).inc()
        self._gauges()

    def _gauges(self) -> None:
        self._metrics.cache_entries.set(len(self._entries))
        self._metrics.cache_bytes.set(self._bytes)


def _scope_of(message: JSONDict) -> str:
    result = message.get("result")
    scope = result.get("cacheScope") if isinstance(result, dict) else None
    return scope if scope in ("public", "private") else "none"
