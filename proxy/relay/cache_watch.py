"""The proxy's own upstream subscription while the response cache holds anything.

A `list_changed` or `resources/updated` must empty the matching entries at once, not when
their TTL runs out (docs/translation.md §5 Invalidation), and the clients' own subscriptions may not
cover what the cache holds. So once something is cached the proxy listens itself: on a modern
upstream with `subscriptions/listen`, on a legacy one with a session's GET stream and
`resources/subscribe` for the cached resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog

from .. import PROXY_INFO, tracing
from ..config import Settings
from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol import legacy_to_modern as l2m
from ..protocol.versions import Era
from ..state.cache import ResponseCache
from ..upstream.errors import UpstreamError
from ..upstream.legacy_session import LegacyUpstreamSession
from .detect import EraDetector
from .legacy_to_modern import TranslatingBackend
from .listen import UpstreamListener, listen_request
from .modern_to_legacy import ModernToLegacy

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)


class CacheWatcher:
    def __init__(
        self,
        settings: Settings,
        cache: ResponseCache,
        detector: EraDetector,
        legacy_clients: TranslatingBackend,
        modern_clients: ModernToLegacy,
    ) -> None:
        self._settings = settings
        self._cache = cache
        self._detector = detector
        self._legacy_clients = legacy_clients
        self._modern_clients = modern_clients
        self._listener: UpstreamListener | None = None  # modern upstream
        self._session: LegacyUpstreamSession | None = None  # legacy upstream
        self._subscribed: set[str] = set()
        self._capabilities: JSONDict = {}
        self._task: asyncio.Task[None] | None = None
        self._dirty = asyncio.Event()
        self._listens = itertools.count(1)

    def watch(self, uri: str | None) -> None:
        """Called when an entry is stored: start watching, or add the resource it holds (`uri`)."""
        if not self._settings.cache.watch:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="cache-watch", context=tracing.background())
        elif uri is not None and uri not in self._subscribed:
            self._dirty.set()

    def reset(self) -> None:
        """The upstream changed era: the next stored entry starts a fresh watch."""
        if self._task is not None:
            self._task.cancel()
        self._task = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._stop()

    def _uris(self) -> list[str]:
        return self._cache.watched_uris()[: self._settings.cache.watched_resources_max]

    async def _run(self) -> None:
        try:
            era = await self._detector.current(needs=False)  # a watcher brings nothing to the probe
            while True:
                try:
                    await (self._follow_modern() if era is Era.MODERN else self._follow_legacy())
                except (UpstreamError, ProxyError, TimeoutError) as exc:
                    log.warning("cache_watch_failed", error=str(exc))
                    await self._stop()
                    return  # entries still expire by TTL; the next stored entry tries again
                self._dirty.clear()
                await self._dirty.wait()
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._stop())

    async def _follow_modern(self) -> None:
        if self._listener is None:
            discover = await self._legacy_clients.discover()
            self._capabilities = jsonrpc.obj(discover.get("capabilities"))
            self._listener = UpstreamListener(
                open_stream=self._open_listen,
                current_filter=self._filter,
                deliver=self._cache.invalidate_for,
                retry_max_s=self._settings.streams.listen_retry_max_s,
            )
        ack = await self._listener.refresh()
        self._subscribed = set(ack.get("resourceSubscriptions") or ())

    def _filter(self) -> JSONDict:
        return l2m.listen_filter(self._capabilities, set(self._uris()), list_changes=True)

    @asynccontextmanager
    async def _open_listen(self, filter_: JSONDict) -> AsyncIterator[Any]:
        upstream = self._legacy_clients.upstream
        upstream_id = f"cache-watch-{next(self._listens)}"
        profile = l2m.ClientProfile(self._legacy_clients.modern_version, {}, PROXY_INFO)
        outgoing = listen_request(upstream_id, filter_, l2m.request_meta(profile))
        async with upstream.exchange(outgoing, l2m.upstream_headers(outgoing, profile.modern_version)) as reply:
            yield reply

    async def _follow_legacy(self) -> None:
        if self._session is None or self._session.closed:
            self._session = await self._modern_clients.pool.open_dedicated({}, None, {}, owner=self, push_wait_s=0.25)
            self._subscribed = set()
        resources = self._session.server_capabilities.get("resources")
        if isinstance(resources, dict) and resources.get("subscribe"):
            for uri in self._uris():
                if uri not in self._subscribed:
                    await self._session.call("resources/subscribe", {"uri": uri}, timeout_s=10.0)
                    self._subscribed.add(uri)

    # SessionOwner for the legacy session: everything it is told goes to invalidation.
    def on_notification(self, session: LegacyUpstreamSession, note: JSONDict) -> None:
        self._cache.invalidate_for(note)

    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None:
        self._modern_clients.on_server_request(session, request)

    async def _stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()
        session, self._session = self._session, None
        if session is not None:
            await self._modern_clients.pool.discard(session)
        self._subscribed = set()
