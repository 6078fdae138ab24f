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

from .config import Settings
from .downstream.admin import Admin
from .downstream.guard import Guard, json_errors
from .downstream.http import McpEndpoint
from .metrics import Metrics
from .relay.legacy_to_modern import LegacyToModern
from .relay.modern_to_legacy import ModernToLegacy
from .relay.modern_to_legacy import probe as probe_legacy
from .sessions import InMemorySessionStore, SessionIds, SessionStore
from .upstream.http import HttpUpstream

log = structlog.get_logger("mcp_era_proxy")

METRICS = web.AppKey("metrics", Metrics)
RELAY = web.AppKey("relay", LegacyToModern)
MODERN_RELAY = web.AppKey("modern_relay", ModernToLegacy)
ADMIN = web.AppKey("admin", Admin)


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    store: SessionStore | None = None,
    client_session: aiohttp.ClientSession | None = None,
    clock: Any = time.time,
) -> tuple[web.Application, web.Application | None]:
    """The MCP application, and the admin application when it listens separately."""
    metrics = metrics or Metrics()
    owns_session = client_session is None
    session = client_session or HttpUpstream.client_session(settings.upstream)
    upstream = HttpUpstream(settings.upstream, session)
    secret = settings.security.secret.encode() if settings.security.secret else secrets.token_bytes(32)
    legacy_clients: LegacyToModern | None = None
    modern_clients: ModernToLegacy | None = None
    if settings.upstream.era == "modern":
        ids = SessionIds(secret, settings.sessions.max_lifetime_s, clock)
        legacy_clients = LegacyToModern(settings, upstream, store or InMemorySessionStore(), ids, metrics, clock)
        probe: Callable[[], Awaitable[object]] = legacy_clients.probe
    else:
        modern_clients = ModernToLegacy(settings, upstream, metrics, secret, clock)
        probe = partial(probe_legacy, modern_clients)
    endpoint = McpEndpoint(settings, upstream, metrics, legacy_clients=legacy_clients, modern_clients=modern_clients)
    admin = Admin(settings, upstream, metrics, probe=probe, upstream_era=lambda: settings.upstream.era)

    guard = Guard(settings, settings.path)
    app = web.Application(middlewares=[json_errors, guard.middleware], client_max_size=settings.security.max_body_bytes)
    app[METRICS] = metrics
    if legacy_clients is not None:
        app[RELAY] = legacy_clients
    if modern_clients is not None:
        app[MODERN_RELAY] = modern_clients
    app[ADMIN] = admin
    app.router.add_post(settings.path, endpoint.post)
    app.router.add_get(settings.path, endpoint.get)
    app.router.add_delete(settings.path, endpoint.delete)

    admin_app = app if settings.admin_listen is None else web.Application(middlewares=[json_errors])
    admin_app.router.add_get("/healthz", admin.healthz)
    admin_app.router.add_get("/readyz", admin.readyz)
    admin_app.router.add_get("/metrics", admin.metrics)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        tasks = []
        if legacy_clients is not None:
            tasks.append(asyncio.create_task(_every(_reap_interval(settings), legacy_clients.reap)))
        if modern_clients is not None:
            interval = max(min(settings.upstream.pool.idle_timeout_s, settings.upstream.pool.ping_interval_s) / 4, 0.25)
            tasks.append(asyncio.create_task(_every(min(interval, 30.0), modern_clients.maintain)))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if legacy_clients is not None:
            await legacy_clients.close_all()
        if modern_clients is not None:
            await modern_clients.close_all()
        if owns_session:
            await session.close()

    app.cleanup_ctx.append(lifecycle)
    return app, (None if admin_app is app else admin_app)


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
