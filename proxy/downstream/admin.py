"""Operational endpoints: /healthz (process alive), /readyz (the upstream can serve its era), /metrics,
/clients (the migration report)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import __version__
from ..config import Settings
from ..metrics import PREFIX, STREAM_KINDS, Metrics
from ..relay.scopes import SharedRun
from . import status_page
from .clients import ClientReport
from .reply import json_response

# The kinds of streams_open (metrics.STREAM_KINDS) as the status page says them.
STREAMS_IN_WORDS = {
    "downstream_get": "legacy clients' GET streams (server requests and notifications)",
    "downstream_listen": "2026-07-28 clients' listen streams (subscriptions/listen)",
    "downstream_sse": "HTTP+SSE clients' streams (2024-11-05)",
    "upstream_listen": "listens held upstream for legacy clients' sessions",
}


class Admin:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        fresh: Callable[[], bool],
        probe: Callable[[], Awaitable[object]],
        upstream_era: Callable[[], str],
        era_problem: Callable[[], str | None] = lambda: None,
        clients: ClientReport | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._fresh = fresh  # the upstream's era handshake worked within readiness.window_s
        self._probe = probe
        self._upstream_era = upstream_era
        # Why the upstream cannot serve the configured era (EraDetector.mismatch), if it cannot.
        self._era_problem = era_problem
        self._clients = clients
        # The readiness probe running, owned here: a poll that stops waiting (its timeout) leaves
        # it running and the next poll waits for it. Cancelling it would kill what it was starting
        # (a stdio server on a cold `npx` cache), and each poll would start another.
        self._probing = SharedRun[object]()
        self.draining = False

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        fresh = self._fresh()
        error = None
        # An upstream that answers, but not in the configured era, is no more ready than one that
        # does not: the probe runs then too, and only a probe of that era clears it.
        if (not fresh or self._era_problem() is not None) and not self.draining:
            try:
                async with asyncio.timeout(self._settings.readiness.probe_timeout_s):
                    await self._probing.join(self._probe)
                fresh = True
            except TimeoutError:
                error = "the upstream has not answered the readiness probe yet (still starting?)"
            except Exception as exc:
                error = str(exc) or exc.__class__.__name__
        problem = self._era_problem()
        if problem is not None:
            fresh, error = False, problem
        ready = fresh and not self.draining
        body = {"ready": ready, "upstream": self._settings.upstream.name, "upstream_era": self._upstream_era()}
        if error:
            body["error"] = error
        if self.draining:
            body["draining"] = True
        return json_response(body, 200 if ready else 503)

    async def status(self, request: web.Request) -> web.Response:
        """The status page for people (downstream/status_page.py): what /readyz, /metrics and
        /clients say, on one page that refreshes itself. It never probes the upstream itself."""
        registry = self._metrics.registry
        name = self._settings.upstream.name

        def sample(metric: str, **labels: str) -> float | None:
            return registry.get_sample_value(PREFIX + metric, labels)

        fresh = self._fresh()
        problem = self._era_problem()
        reason = problem or (None if fresh else "no answer from the upstream within readiness.window_s")
        gauges = {
            "legacy sessions (held here)": sample("sessions_open", downstream_era="legacy"),
            **{STREAMS_IN_WORDS[kind]: sample("streams_open", kind=kind) for kind in STREAM_KINDS},
            "parked calls (waiting for a modern client's input)": sample("parked_calls"),
            "upstream legacy sessions (pooled)": sample("upstream_sessions_open", upstream=name),
            "upstream server processes": sample("upstream_processes", upstream=name),
            "upstream HTTP+SSE connections": sample("upstream_sse_sessions", upstream=name),
        }
        store_up = sample("store_up")
        store = (
            "none (this process only: one replica)"
            if self._settings.store.url is None
            else "answering"
            if store_up == 1
            else "not answering"
        )
        page = status_page.render(
            upstream=name,
            upstream_era=self._upstream_era(),
            ready=fresh and problem is None,
            reason=reason,
            draining=self.draining,
            gauges=gauges,
            store=store,
            clients=self._clients.rows() if self._clients is not None else [],
            max_tracked=self._settings.clients.max_tracked,
            version=__version__,
        )
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def clients(self, request: web.Request) -> web.Response:
        """The migration report (proxy/downstream/clients.py): who speaks which protocol, this replica's share."""
        rows = self._clients.rows() if self._clients is not None else []
        return json_response({"clients": rows, "maxTracked": self._settings.clients.max_tracked})

    async def close(self) -> None:
        """Shutdown: a readiness probe still running is stopped."""
        await self._probing.aclose()

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
