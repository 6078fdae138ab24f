"""Composition root: builds the aiohttp application from Settings; every collaborator injectable."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from .cache import ResponseCache
from .config import Settings
from .downstream.admin import Admin
from .downstream.guard import Guard, method_not_allowed, not_found, safe
from .downstream.http import McpEndpoint
from .metrics import Metrics
from .protocol.detection import Detected
from .protocol.versions import Era
from .relay.cache_watch import CacheWatcher
from .relay.detect import EraDetector, probe_http, probe_stdio
from .relay.legacy_to_modern import LegacyToModern
from .relay.legacy_upstream import SessionFactory, StdioLegacySession
from .relay.modern_to_legacy import ModernToLegacy
from .relay.modern_to_legacy import probe as probe_legacy
from .relay.passthrough import LegacyFacade, ModernPassThrough
from .sessions import InMemorySessionStore, SessionIds, SessionStore
from .upstream.http import HttpUpstream
from .upstream.stdio import StdioChannel, StdioModernUpstream, process_factory

log = structlog.get_logger("mcp_era_proxy")

METRICS = web.AppKey("metrics", Metrics)
RELAY = web.AppKey("relay", LegacyToModern)
MODERN_RELAY = web.AppKey("modern_relay", ModernToLegacy)
ADMIN = web.AppKey("admin", Admin)
DETECTOR = web.AppKey("detector", EraDetector)
CACHE = web.AppKey("cache", ResponseCache)


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    store: SessionStore | None = None,
    client_session: aiohttp.ClientSession | None = None,
    clock: Any = time.time,
    cache_clock: Any = time.monotonic,
) -> tuple[web.Application, web.Application | None]:
    """The MCP application, and the admin application when it listens separately."""
    metrics = metrics or Metrics()
    config = settings.upstream
    secret = settings.security.secret.encode() if settings.security.secret else secrets.token_bytes(32)
    ids = SessionIds(secret, settings.sessions.max_lifetime_s, clock)
    cache = ResponseCache(settings.cache, metrics, cache_clock)
    http: HttpUpstream | None = None
    stdio: StdioModernUpstream | None = None
    modern_http: ModernPassThrough | None = None
    modern_stdio: ModernPassThrough | None = None
    legacy_stdio: LegacyFacade | None = None
    session_factory: SessionFactory | None = None
    owns_session = client_session is None
    if config.transport == "http":
        http = HttpUpstream(config, client_session or HttpUpstream.client_session(config))
        modern_upstream: Any = http
        modern_http = ModernPassThrough(settings, http, metrics, cache)
        probe: Callable[[], Awaitable[Detected]] = partial(probe_http, http, config.probe_timeout_s)
    else:
        assert config.command is not None
        make = process_factory(config.command, config.name, config.env, config.cwd)
        stdio = modern_upstream = StdioModernUpstream(
            config.name, make, grace_s=config.shutdown_grace_s, backoff_max_s=config.restart_backoff_max_s
        )
        session_factory = partial(StdioLegacySession, make, config.name, config.shutdown_grace_s)
        modern_stdio = ModernPassThrough(settings, stdio, metrics, cache)
        legacy_stdio = LegacyFacade(settings, make, config.name, InMemorySessionStore(), ids, metrics, clock)

        async def probe_channel() -> StdioChannel:
            channel = StdioChannel(make, config.name)
            await channel.start()
            return channel

        probe = partial(probe_stdio, probe_channel, config.probe_timeout_s)
    detector = EraDetector(config.era, probe)

    legacy_clients = LegacyToModern(
        settings, modern_upstream, store or InMemorySessionStore(), ids, metrics, clock, cache=cache
    )
    legacy_clients.on_era_mismatch = detector.suspect
    modern_clients = ModernToLegacy(settings, modern_upstream, metrics, secret, clock, session_factory, cache=cache)
    modern_clients.on_era_mismatch = detector.suspect
    watcher = CacheWatcher(settings, cache, detector, legacy_clients, modern_clients)
    cache.on_store = watcher.watch

    def era_changed(era: Era) -> None:
        cache.clear("era_changed")
        watcher.reset()

    detector.on_change = era_changed
    endpoint = McpEndpoint(
        settings,
        metrics,
        detector,
        legacy_clients=legacy_clients,
        modern_clients=modern_clients,
        http_upstream=http,
        modern_http=modern_http,
        modern_stdio=modern_stdio,
        legacy_stdio=legacy_stdio,
    )

    async def ready() -> None:
        if await detector.current() is Era.MODERN:
            await legacy_clients.probe()
        else:
            await probe_legacy(modern_clients)

    admin = Admin(
        settings,
        metrics,
        last_ok=lambda: _last_ok(detector, http, stdio),
        probe=ready,
        upstream_era=lambda: detector.era.value if detector.era is not None else "unknown",
    )

    guard = Guard(settings)
    app = web.Application(client_max_size=settings.security.max_body_bytes)
    app[METRICS] = metrics
    app[RELAY] = legacy_clients
    app[MODERN_RELAY] = modern_clients
    app[DETECTOR] = detector
    app[CACHE] = cache
    app[ADMIN] = admin
    app.router.add_post(settings.path, safe(endpoint.post, guard))
    app.router.add_get(settings.path, safe(endpoint.get, guard))
    app.router.add_delete(settings.path, safe(endpoint.delete, guard))
    app.router.add_route("*", settings.path, safe(method_not_allowed, guard))

    admin_app = app if settings.admin_listen is None else web.Application()
    admin_app.router.add_get("/healthz", safe(admin.healthz))
    admin_app.router.add_get("/readyz", safe(admin.readyz))
    admin_app.router.add_get("/metrics", safe(admin.metrics))
    for application in {id(app): app, id(admin_app): admin_app}.values():
        application.router.add_route("*", "/{tail:.*}", safe(not_found))  # JSON, never aiohttp's text page

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        pool = settings.upstream.pool
        pool_interval = min(max(min(pool.idle_timeout_s, pool.ping_interval_s) / 4, 0.25), 30.0)
        jobs = [(_reap_interval(settings), legacy_clients.reap), (pool_interval, modern_clients.maintain)]
        if legacy_stdio is not None:
            jobs.append((_reap_interval(settings), legacy_stdio.reap))
        tasks = [asyncio.create_task(_every(interval, job)) for interval, job in jobs]
        tasks.append(asyncio.create_task(_detect_early(detector)))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watcher.close()
        await legacy_clients.close_all()
        await modern_clients.close_all()
        if legacy_stdio is not None:
            await legacy_stdio.close_all()
        if stdio is not None:
            await stdio.close()
        if http is not None and owns_session:
            await http.close()

    async def drain(app: web.Application) -> None:
        """Shutdown begins (sites stopped): not ready any more; streams end gracefully now, calls in
        flight get `shutdown.grace_s` (aiohttp's shutdown timeout) before the cleanup below."""
        admin.draining = True
        legacy_clients.end_streams()
        modern_clients.end_streams()
        for same_era in (modern_http, modern_stdio, legacy_stdio):
            if same_era is not None:
                same_era.end_streams()

    app.on_shutdown.append(drain)
    app.cleanup_ctx.append(lifecycle)
    return app, (None if admin_app is app else admin_app)


def _last_ok(detector: EraDetector, http: HttpUpstream | None, stdio: StdioModernUpstream | None) -> float | None:
    """When the upstream last answered; a stdio server counts only while its process runs."""
    if http is not None:
        return http.last_ok
    if stdio is not None and detector.era is Era.MODERN and stdio.healthy:
        return stdio.last_ok
    return None  # legacy stdio: readiness asks a pooled session (process) each time


async def _detect_early(detector: EraDetector) -> None:
    """Learn the upstream's era at start, so the first request does not wait for it."""
    try:
        await detector.current()
    except Exception as exc:
        log.warning("upstream_era_unknown", error=str(exc) or exc.__class__.__name__)


def _reap_interval(settings: Settings) -> float:
    sessions = settings.sessions
    return max(min(sessions.idle_timeout_s / 4, sessions.max_lifetime_s / 4, 30.0), 0.25)


async def _every(interval: float, job: Callable[[], Awaitable[object]]) -> None:
    """Run a housekeeping job forever; one failing pass must not stop the next."""
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except Exception:
            log.exception("housekeeping_failed", job=getattr(job, "__qualname__", str(job)))
