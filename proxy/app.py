"""Composition root: builds the aiohttp application from Settings; every collaborator injectable."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
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
from .sessions import InMemorySessionStore, SessionIds, SessionStore
from .upstream.http import HttpUpstream

log = structlog.get_logger("mcp_era_proxy")

METRICS = web.AppKey("metrics", Metrics)
RELAY = web.AppKey("relay", LegacyToModern)
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
    ids = SessionIds(secret, settings.sessions.max_lifetime_s, clock)
    relay = LegacyToModern(settings, upstream, store or InMemorySessionStore(), ids, metrics, clock)
    endpoint = McpEndpoint(settings, relay, upstream, metrics)
    admin = Admin(settings, upstream, metrics, probe=relay.probe, upstream_era=lambda: settings.upstream.era)

    guard = Guard(settings, settings.path)
    app = web.Application(middlewares=[json_errors, guard.middleware], client_max_size=settings.security.max_body_bytes)
    app[METRICS] = metrics
    app[RELAY] = relay
    app[ADMIN] = admin
    app.router.add_post(settings.path, endpoint.post)
    app.router.add_get(settings.path, endpoint.get)
    app.router.add_delete(settings.path, endpoint.delete)

    admin_app = app if settings.admin_listen is None else web.Application(middlewares=[json_errors])
    admin_app.router.add_get("/healthz", admin.healthz)
    admin_app.router.add_get("/readyz", admin.readyz)
    admin_app.router.add_get("/metrics", admin.metrics)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap(relay, settings))
        yield
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await relay.close_all()
        if owns_session:
            await session.close()

    app.cleanup_ctx.append(lifecycle)
    return app, (None if admin_app is app else admin_app)


async def _reap(relay: LegacyToModern, settings: Settings) -> None:
    sessions = settings.sessions
    interval = max(min(sessions.idle_timeout_s / 4, sessions.max_lifetime_s / 4, 30.0), 0.25)
    while True:
        await asyncio.sleep(interval)
        try:
            await relay.reap()
        except Exception:
            log.exception("reaper_failed")
