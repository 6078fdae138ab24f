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

from . import tracing as tracing_interface
from .auth.discovery import WELL_KNOWN_AUTHORIZATION_SERVER, WELL_KNOWN_OPENID, WELL_KNOWN_RESOURCE, Discovery
from .auth.identity import Identifier
from .auth.tokens import TokenVerifier
from .cluster.envelope import SSE_MESSAGE_ROUTE
from .cluster.forward import Forwarder
from .cluster.owners import Owner, ServerRequestIds, new_boot_id
from .cluster.replay import ReplayEndpoint, internal_app
from .config import Settings, SseTarget, TracingConfig
from .downstream.admin import Admin
from .downstream.clients import ClientReport
from .downstream.guard import Guard, allowing, method_not_allowed, not_found, safe
from .downstream.http import McpEndpoint
from .downstream.legacy_sse import LegacySseEndpoint
from .metrics import Metrics
from .protocol.request_state import RequestStateCodec
from .protocol.versions import Era
from .relay.assemble import LateCallback
from .relay.binding import CallerBinding
from .relay.bytes import ByteRelay
from .relay.cache_watch import CacheWatcher
from .relay.connection_sessions import ProcessBackend
from .relay.detect import EraDetector, Probe, probe_http, probe_stdio
from .relay.failures import UpstreamFailures
from .relay.legacy_sessions import LegacySessionHost
from .relay.legacy_to_modern import TranslatingBackend
from .relay.modern_to_legacy import ModernToLegacy
from .relay.modern_to_legacy import probe as probe_legacy
from .relay.passthrough import ModernPassThrough
from .relay.routes import routing_table
from .relay.tasks.host import LegacyTaskHost
from .state.cache import ResponseCache
from .state.redis_store import RedisSessionStore, redis_store
from .state.redis_tasks import RedisTaskStore
from .state.sealing import Sealer
from .state.sessions import InMemorySessionStore, SessionIds, SessionStore
from .state.task_records import InMemoryTaskStore, TaskStore
from .tracing import NO_TRACING, Tracing
from .upstream.edge import build_upstream
from .upstream.errors import UpstreamHTTPError
from .upstream.http import HttpUpstream
from .upstream.sse import SseConnector, serves_sse
from .upstream.stdio import StdioChannel, StdioModernUpstream

log = structlog.get_logger(__name__)

METRICS = web.AppKey("metrics", Metrics)
LEGACY_TO_MODERN = web.AppKey("legacy_to_modern", LegacySessionHost[Any])  # legacy sessions, translated
LEGACY_STDIO = web.AppKey("legacy_stdio", LegacySessionHost[Any])  # legacy sessions, a server process each
MODERN_TO_LEGACY = web.AppKey("modern_to_legacy", ModernToLegacy)
ADMIN = web.AppKey("admin", Admin)
DETECTOR = web.AppKey("detector", EraDetector)
CACHE = web.AppKey("cache", ResponseCache)
FORWARDER = web.AppKey("forwarder", Forwarder)
DISCOVERY = web.AppKey("discovery", Discovery)  # the OAuth well-known endpoints, the challenges
LEGACY_TASKS = web.AppKey("legacy_tasks", LegacyTaskHost)  # 2025-11-25 clients' tasks, when hosted
INTERNAL = web.AppKey("internal", web.Application)  # the internal listener's application, when configured


def tracing_from_settings(config: TracingConfig) -> Tracing:
    """The proxy's tracing for its `tracing` settings: none without an endpoint. Chosen here, at
    the composition root, so that the interface (proxy/tracing) never imports its implementation."""
    if config.otlp_endpoint is None:
        return NO_TRACING
    tracing_interface.require(config)
    from .tracing.otel import OtelTracing

    return OtelTracing.exporting(config)


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    store: SessionStore | None = None,
    client_session: aiohttp.ClientSession | None = None,
    clock: Callable[[], float] = time.time,
    cache_clock: Callable[[], float] = time.monotonic,
    tracing: Tracing | None = None,
) -> tuple[web.Application, web.Application | None]:
    """The MCP application, and the admin application when it listens separately. `tracing`: spans
    on a provider of the caller's (tracing_otel.OtelTracing); by default per `settings.tracing`."""
    metrics = metrics or Metrics()
    tracing = tracing if tracing is not None else tracing_from_settings(settings.tracing)
    config = settings.upstream
    secret = settings.security.secret.encode() if settings.security.secret else secrets.token_bytes(32)
    previous = [old.encode() for old in settings.security.previous_secrets]
    sealer = Sealer(secret, previous, clock)
    ids = SessionIds(sealer, settings.sessions.max_lifetime_s, clock)
    # This process, as the tokens it mints name it: a new boot id each start, so a successor at
    # the same address is never taken for it.
    owner = Owner(new_boot_id(), settings.replicas.advertised)
    boot = owner.boot
    codec = RequestStateCodec(sealer, owner.boot, owner.address, clock)
    server_ids = ServerRequestIds(sealer, owner)
    forwarder = Forwarder(settings, sealer, owner, codec, server_ids, metrics, clock)
    cache_stored = LateCallback[[str | None]]("cache stored")  # bound to the watcher, built below
    cache = ResponseCache(settings.cache, metrics, cache_clock, on_store=cache_stored)
    failures = UpstreamFailures(metrics, own_credentials=settings.auth.mode == "resource_server")
    # resource_server: the upstream sees only the proxy's credentials, so the proxy binds a same-era
    # upstream's session ids and requestState to the caller (relay/binding.py).
    binding = None
    if settings.auth.mode == "resource_server":
        binding = CallerBinding(sealer, max_state_chars=settings.security.max_body_bytes)
    edge = build_upstream(config, metrics, client_session)
    http, stdio, modern_upstream = edge.http, edge.stdio, edge.modern
    legacy_sessions = edge.legacy_sessions
    byte_relay: ByteRelay | None = None
    process_sessions: LegacySessionHost[Any] | None = None
    probe: Probe
    if edge.processes is None:
        assert http is not None
        probe = partial(probe_http, http, config.era_probe_timeout_s)
    else:
        make = edge.processes.make
        # A session that is a process (or an SSE connection) cannot be shared with other replicas:
        # it lives here only. It is bounded in number and ended sooner when idle than a session
        # record expires.
        process_sessions = LegacySessionHost(
            ProcessBackend(settings, make, config.name, failures),
            settings,
            InMemorySessionStore(),
            ids,
            metrics,
            clock,
            max_live=edge.processes.max_live,
            idle_timeout_s=edge.processes.idle_s,
        )

        async def probe_channel() -> StdioChannel:
            channel = StdioChannel(make, config.name)
            await channel.start()
            return channel

        probe = partial(probe_stdio, probe_channel, config.era_probe_timeout_s)
    era_changed = LateCallback[[Era]]("era changed")  # bound to the cache and the watcher, built below
    detector = EraDetector("legacy" if isinstance(edge.target, SseTarget) else config.era, probe, on_change=era_changed)
    if http is not None:
        byte_relay = ByteRelay(http, failures, config.request_timeout_s, binding, on_era_mismatch=detector.suspect)

    owned_store: RedisSessionStore | None = None
    if store is None and settings.store.url is not None:
        store = owned_store = redis_store(
            settings.store,
            sealer,
            idle_timeout_s=settings.sessions.idle_timeout_s,
            max_lifetime_s=settings.sessions.max_lifetime_s,
            metrics=metrics,
            clock=clock,
        )
    store = store or InMemorySessionStore()
    legacy_tasks: LegacyTaskHost | None = None
    if settings.tasks.enabled:
        task_store: TaskStore = RedisTaskStore(owned_store) if owned_store is not None else InMemoryTaskStore(clock)
        legacy_tasks = LegacyTaskHost(
            settings.tasks, task_store, metrics, owner=f"{boot}@{settings.replicas.advertised or ''}", clock=clock
        )
    named = f"{boot}@{settings.replicas.advertised or ''}"  # how this replica names itself in shared records
    translating_backend = TranslatingBackend(
        settings,
        modern_upstream,
        store,
        metrics,
        cache,
        failures,
        server_ids=server_ids.mint,
        tasks=legacy_tasks,
        claimant=named,
        on_era_mismatch=detector.suspect,
    )
    legacy_to_modern = LegacySessionHost(translating_backend, settings, store, ids, metrics, clock, owner=named)
    same_era = ModernPassThrough(settings, modern_upstream, metrics, cache, failures, binding)
    modern_to_legacy = ModernToLegacy(
        settings,
        legacy_sessions,
        metrics,
        codec,
        clock,
        cache=cache,
        failures=failures,
        tasks=legacy_tasks,
        on_era_mismatch=detector.suspect,
    )
    router = routing_table(
        edge.target.kind,
        translating=legacy_to_modern,
        process_sessions=process_sessions,
        same_era=same_era,
        modern_to_legacy=modern_to_legacy,
        byte_relay=byte_relay,
    )
    watcher = CacheWatcher(settings, cache, detector, translating_backend, modern_to_legacy)
    cache_stored.bind(watcher.watch)

    def clear_for_era(era: Era) -> None:
        cache.clear("era_changed")
        watcher.reset()

    era_changed.bind(clear_for_era)
    guard = Guard(settings)
    discovery = Discovery(settings, guard.host_allowed, clock=cache_clock)
    # JWTs of auth.issuers are verified (the caller is their subject; resource_server: the gate).
    verifier = None
    if settings.auth.issuers:
        verifier = TokenVerifier(settings.auth, issuer_metadata=discovery.issuer_metadata)
    identifier = Identifier(settings, verifier, discovery.public_resource, metrics)
    clients = ClientReport(settings.clients.max_tracked, metrics)
    endpoint = McpEndpoint(
        settings,
        metrics,
        detector,
        router,
        failures,
        forwarder,
        sealer=sealer,
        boot=boot,
        identifier=identifier,
        tracing=tracing,
        tasks=legacy_tasks,
        clients=clients,
    )

    async def ready() -> None:
        try:
            if await detector.current() is Era.MODERN:
                await translating_backend.probe()
            else:
                await probe_legacy(modern_to_legacy)
        except UpstreamHTTPError as exc:
            if exc.status not in (401, 403):
                raise
            # It answered: an OAuth-protected upstream refuses a probe without a caller's token,
            # and is as ready as it will be (its era is learnt with the first caller's).
            return
        detector.confirm()  # it serves the era it is taken for

    admin = Admin(
        settings,
        metrics,
        last_ok=lambda: _last_ok(detector, http, stdio),
        probe=ready,
        upstream_era=lambda: detector.era.value if detector.era is not None else "unknown",
        era_problem=lambda: detector.mismatch,
        clients=clients,
    )

    app = web.Application(client_max_size=settings.security.max_body_bytes)
    app[METRICS] = metrics
    app[LEGACY_TO_MODERN] = legacy_to_modern
    app[MODERN_TO_LEGACY] = modern_to_legacy
    if process_sessions is not None:
        app[LEGACY_STDIO] = process_sessions
    app[DETECTOR] = detector
    app[CACHE] = cache
    if legacy_tasks is not None:
        app[LEGACY_TASKS] = legacy_tasks
    app[ADMIN] = admin
    app[FORWARDER] = forwarder
    app.router.add_post(settings.path, safe(endpoint.post, guard))
    app.router.add_get(settings.path, safe(endpoint.get, guard))
    app.router.add_delete(settings.path, safe(endpoint.delete, guard))
    app.router.add_route("*", settings.path, safe(method_not_allowed, guard))
    endpoint_handlers = {"POST": safe(endpoint.post), "GET": safe(endpoint.get), "DELETE": safe(endpoint.delete)}
    legacy_sse: LegacySseEndpoint | None = None
    if settings.downstream.sse.enabled:
        # 2024-11-05 HTTP+SSE clients, served through the endpoint's own handlers.
        legacy_sse = LegacySseEndpoint(settings, endpoint_handlers, identifier, sealer, owner, forwarder, metrics)
        sse_config = settings.downstream.sse
        app.router.add_get(sse_config.path, safe(legacy_sse.stream, guard), allow_head=False)
        app.router.add_route("*", sse_config.path, safe(allowing("GET"), guard))
        app.router.add_post(sse_config.message_path, safe(legacy_sse.message, guard))
        app.router.add_route("*", sse_config.message_path, safe(allowing("POST"), guard))
    app[DISCOVERY] = discovery
    for prefix, handler in (
        (WELL_KNOWN_RESOURCE, discovery.protected_resource),
        (WELL_KNOWN_AUTHORIZATION_SERVER, discovery.authorization_server),
        (WELL_KNOWN_OPENID, discovery.authorization_server),
    ):
        app.router.add_get(prefix + "{tail:.*}", safe(handler))  # GET and HEAD
        app.router.add_route("*", prefix + "{tail:.*}", safe(discovery.method_not_allowed))
    # Every challenge that reaches the client names the proxy's metadata, whichever relay wrote it.
    app.on_response_prepare.append(discovery.on_response_prepare)

    admin_app = app if settings.admin_listen is None else web.Application()
    admin_app.router.add_get("/healthz", safe(admin.healthz))
    admin_app.router.add_get("/readyz", safe(admin.readyz))
    admin_app.router.add_get("/metrics", safe(admin.metrics))
    admin_app.router.add_get("/clients", safe(admin.clients))
    admin_app.router.add_get("/", safe(admin.status))
    for application in {id(app): app, id(admin_app): admin_app}.values():
        application.router.add_route("*", "/{tail:.*}", safe(not_found))  # JSON, never aiohttp's text page
    if settings.replicas.internal_listen is not None:
        # Replays come from other replicas: Origin and Host were checked where the client connected.
        replayed = dict(endpoint_handlers)
        if legacy_sse is not None:
            replayed[SSE_MESSAGE_ROUTE] = safe(legacy_sse.message)
        replay = ReplayEndpoint(sealer, owner, replayed)
        app[INTERNAL] = internal_app(replay, safe, settings.security.max_body_bytes)

    hosts = [host for host in (legacy_to_modern, process_sessions) if host is not None]

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        pool = settings.upstream.pool
        pool_interval = min(max(min(pool.idle_timeout_s, pool.ping_interval_s) / 4, 0.25), 30.0)
        jobs: list[tuple[float, Callable[[], Awaitable[object]]]] = [
            (_reap_interval(h.idle_timeout_s, settings.sessions.max_lifetime_s), h.reap) for h in hosts
        ]
        jobs.append((pool_interval, modern_to_legacy.maintain))
        tasks = [asyncio.create_task(_every(interval, job)) for interval, job in jobs]
        tasks.append(asyncio.create_task(_detect_early(detector)))
        await forwarder.start()
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watcher.close()
        await detector.close()  # an era probe still running (a stdio server starting)
        await admin.close()  # and a readiness probe
        if legacy_tasks is not None:
            await legacy_tasks.close()  # tasks still running fail ("the proxy shut down")
        for host in hosts:
            await host.close_all()
        await translating_backend.settle_cancels()  # upstream tasks given up while closing
        left = await modern_to_legacy.settle(max(0.0, drain_deadline[0] - time.monotonic()))
        if left:
            log.warning("calls_cut_at_shutdown", calls=left)
        await modern_to_legacy.close_all()
        await edge.close()
        await forwarder.close()
        if verifier is not None:
            await verifier.close()
        if owned_store is not None:
            await owned_store.aclose()
        await discovery.close()
        await tracing.shutdown()  # the spans of the calls that ended above are exported too

    drain_deadline = [0.0]  # when parked calls must be given up (set as shutdown begins)

    async def drain(app: web.Application) -> None:
        """Shutdown begins (sites stopped): not ready any more; streams end gracefully now, calls in
        flight get `shutdown.grace_s`, then the endpoint cuts the rest with an error that says so,
        before the cleanup below."""
        admin.draining = True
        drain_deadline[0] = time.monotonic() + settings.shutdown.grace_s
        for host in hosts:
            host.end_streams()
        modern_to_legacy.end_streams()
        same_era.end_streams()
        if legacy_sse is not None:
            legacy_sse.end_streams()
        # One grace, the proxy's own: the calls still running after it get an error that says so
        # (aiohttp's own wait, after this, finds them answered; docs: README "Shutdown").
        await endpoint.drain(settings.shutdown.grace_s)

    app.on_shutdown.append(drain)
    app.cleanup_ctx.append(lifecycle)
    if legacy_sse is not None:
        sse_endpoint = legacy_sse

        async def sse_lifecycle(app: web.Application) -> AsyncIterator[None]:
            # After the relays start, before they close: its streams end while they still serve.
            await sse_endpoint.start()
            yield
            await sse_endpoint.close()

        app.cleanup_ctx.append(sse_lifecycle)
    return app, (None if admin_app is app else admin_app)


async def detect_sse_upstream(settings: Settings, session: aiohttp.ClientSession | None = None) -> Settings:
    """`settings` with upstream.url turned into upstream.sse_url when it is a 2024-11-05 HTTP+SSE
    server's SSE URL (upstream/sse.py serves_sse; upstream.sse.detect), else as they are. Asked
    once, at start: an upstream not answering then stays Streamable HTTP."""
    config = settings.upstream
    if config.url is None or config.era == "modern" or not config.sse.detect:
        return settings
    own = session is None
    session = session or SseConnector.client_session(config.connect_timeout_s)
    try:
        found = await serves_sse(config.url, session, config.headers, config.era_probe_timeout_s)
    finally:
        if own:
            await session.close()
    if not found:
        return settings
    log.info("upstream_sse_detected", upstream=config.name)
    upstream = config.model_copy(update={"url": None, "sse_url": config.url})
    return settings.model_copy(update={"upstream": upstream})


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


def _reap_interval(idle_timeout_s: float, max_lifetime_s: float) -> float:
    return max(min(idle_timeout_s / 4, max_lifetime_s / 4, 30.0), 0.25)


async def _every(interval: float, job: Callable[[], Awaitable[object]]) -> None:
    """Run a housekeeping job forever; one failing pass must not stop the next."""
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except Exception:
            log.exception("housekeeping_failed", job=getattr(job, "__qualname__", str(job)))
