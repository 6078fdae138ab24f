"""Composition root: builds the aiohttp application from Settings; every collaborator injectable.

`create_app` is its steps: the state that outlives a request (`build_state`), the upstream edge
(upstream/edge.py `build_upstream`), the relays over it (relay/assemble.py `build_relays`), what
answers clients (`build_endpoints`), their routes (`mount`), start-up and shutdown (`add_lifecycle`).

What only some settings use is imported when they ask for it, at start-up: the token verifier and
PyJWT (`auth.issuers`), the Redis store (`store.url`), OpenTelemetry (`tracing.otlp_endpoint`), the
HTTP+SSE endpoint (`downstream.sse.enabled`), the replay endpoint (`replicas.internal_listen`), the
HTTP+SSE detection (an `upstream.url` that may be one). A start-up that needs none of them (a
desktop host's `mcp-era-proxy stdio`) does not pay for loading them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from . import tracing as tracing_interface
from .auth.discovery import WELL_KNOWN_AUTHORIZATION_SERVER, WELL_KNOWN_OPENID, WELL_KNOWN_RESOURCE, Discovery
from .auth.identity import Identifier
from .cluster.envelope import SSE_MESSAGE_ROUTE
from .cluster.forward import Forwarder
from .cluster.owners import Owner, ServerRequestIds, new_boot_id
from .config import Settings, TracingConfig
from .downstream.admin import Admin
from .downstream.clients import ClientReport
from .downstream.guard import Guard, allowing, method_not_allowed, not_found, safe
from .downstream.http import McpEndpoint
from .logs import lines_lost
from .metrics import Metrics
from .protocol.request_state import RequestStateCodec
from .relay.assemble import LateCallback, Relays, Shared, build_relays
from .relay.connection_sessions import Process
from .relay.detect import EraDetector
from .relay.legacy_sessions import LegacySessionHost
from .relay.modern_to_legacy import ModernToLegacy
from .relay.session_listens import Translated
from .relay.tasks.host import LegacyTaskHost
from .state.cache import ResponseCache
from .state.sealing import Sealer
from .state.sessions import InMemorySessionStore, SessionIds, SessionStore
from .state.task_records import InMemoryTaskStore, TaskStore
from .tracing import NO_TRACING, Tracing
from .upstream.edge import build_upstream

if TYPE_CHECKING:
    from .auth.tokens import TokenVerifier
    from .downstream.legacy_sse import LegacySseEndpoint
    from .state.redis_store import RedisSessionStore

log = structlog.get_logger(__name__)

METRICS = web.AppKey("metrics", Metrics)
LEGACY_TO_MODERN = web.AppKey("legacy_to_modern", LegacySessionHost[Translated])  # legacy sessions, translated
CONNECTION_SESSIONS = web.AppKey("connection_sessions", LegacySessionHost[Process])  # a process or SSE connection each
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
    on a provider of the caller's (tracing/otel.py OtelTracing); by default per `settings.tracing`.
    `client_session`: the upstream's client of the caller's (not closed here); a Streamable HTTP
    upstream takes only its connections and timeout from it (upstream/wire.py), not its default
    headers, trace configs or middlewares."""
    metrics = metrics or Metrics()
    metrics.log_lines_lost.source = lines_lost  # the process's log, counted by its writer thread
    tracing = tracing if tracing is not None else tracing_from_settings(settings.tracing)
    state = build_state(settings, metrics, store, clock, cache_clock)
    edge = build_upstream(settings.upstream, metrics, client_session)
    relays = build_relays(settings, edge, state.shared, metrics, clock)
    endpoints = build_endpoints(settings, metrics, state, relays, tracing, clock, cache_clock)
    app = web.Application(client_max_size=settings.security.max_body_bytes)
    admin_app = mount(app, settings, metrics, state, relays, endpoints)
    add_lifecycle(app, settings, state, relays, endpoints, tracing)
    return app, (None if admin_app is app else admin_app)


@dataclass(frozen=True)
class State:
    """What outlives a request: sealing, the session and task stores, the response cache."""

    shared: Shared  # what the relays use of it
    owner: Owner  # this process, as the tokens it mints name it
    server_ids: ServerRequestIds
    owned_store: RedisSessionStore | None  # the store built here from settings.store (closed here)


def build_state(
    settings: Settings,
    metrics: Metrics,
    store: SessionStore | None,
    clock: Callable[[], float],
    cache_clock: Callable[[], float],
) -> State:
    """`store`: the caller's session store; by default Redis when `store.url` is set, else memory."""
    secret = settings.security.secret.encode() if settings.security.secret else secrets.token_bytes(32)
    previous = [old.encode() for old in settings.security.previous_secrets]
    sealer = Sealer(secret, previous, clock)
    ids = SessionIds(sealer, settings.sessions.max_lifetime_s, clock)
    # This process, as the tokens it mints name it: a new boot id each start, so a successor at
    # the same address is never taken for it.
    owner = Owner(new_boot_id(), settings.replicas.advertised)
    codec = RequestStateCodec(sealer, owner.boot, owner.address, clock)
    server_ids = ServerRequestIds(sealer, owner)
    cache_stored = LateCallback[[str | None]]("cache stored")
    cache = ResponseCache(settings.cache, metrics, cache_clock, on_store=cache_stored)
    owned_store: RedisSessionStore | None = None
    if store is None and settings.store.url is not None:
        from .state.redis_store import redis_store

        store = owned_store = redis_store(
            settings.store,
            sealer,
            idle_timeout_s=settings.sessions.idle_timeout_s,
            max_lifetime_s=settings.sessions.max_lifetime_s,
            metrics=metrics,
            clock=clock,
        )
    store = store or InMemorySessionStore()
    named = f"{owner.boot}@{settings.replicas.advertised or ''}"  # how this replica names itself in records
    legacy_tasks: LegacyTaskHost | None = None
    if settings.tasks.enabled:
        task_store: TaskStore = InMemoryTaskStore(clock)
        if owned_store is not None:
            from .state.redis_tasks import RedisTaskStore

            task_store = RedisTaskStore(owned_store)
        legacy_tasks = LegacyTaskHost(settings.tasks, task_store, metrics, owner=named, clock=clock)
    shared = Shared(sealer, ids, store, cache, cache_stored, codec, server_ids.mint, legacy_tasks, named)
    return State(shared, owner, server_ids, owned_store)


@dataclass(frozen=True)
class Endpoints:
    """What answers clients: the MCP endpoint (and the HTTP+SSE one), discovery, the admin pages."""

    forwarder: Forwarder
    guard: Guard
    discovery: Discovery
    verifier: TokenVerifier | None
    endpoint: McpEndpoint
    handlers: dict[str, Handler]  # the MCP endpoint's own handlers, by method (no Origin/Host guard)
    legacy_sse: LegacySseEndpoint | None
    admin: Admin


def build_endpoints(
    settings: Settings,
    metrics: Metrics,
    state: State,
    relays: Relays,
    tracing: Tracing,
    clock: Callable[[], float],
    cache_clock: Callable[[], float],
) -> Endpoints:
    sealer, owner = state.shared.sealer, state.owner
    forwarder = Forwarder(settings, sealer, owner, state.shared.codec, state.server_ids, metrics, clock)
    guard = Guard(settings)
    discovery = Discovery(settings, guard.host_allowed, clock=cache_clock)
    # JWTs of auth.issuers are verified (the caller is their subject; resource_server: the gate).
    verifier: TokenVerifier | None = None
    if settings.auth.issuers:
        # PyJWT, and cryptography's certificates and keys with it, only for the tokens of auth.issuers.
        from .auth.tokens import TokenVerifier

        verifier = TokenVerifier(settings.auth, issuer_metadata=discovery.issuer_metadata)
    identifier = Identifier(settings, verifier, discovery.public_resource, metrics)
    clients = ClientReport(settings.clients.max_tracked, metrics)
    endpoint = McpEndpoint(
        settings,
        metrics,
        relays.detector,
        relays.router,
        relays.failures,
        forwarder,
        sealer=sealer,
        boot=owner.boot,
        identifier=identifier,
        tracing=tracing,
        tasks=state.shared.tasks,
        clients=clients,
    )
    handlers: dict[str, Handler] = {
        "POST": safe(endpoint.post),
        "GET": safe(endpoint.get),
        "DELETE": safe(endpoint.delete),
    }
    legacy_sse = None
    if settings.downstream.sse.enabled:
        from .downstream.legacy_sse import LegacySseEndpoint

        # 2024-11-05 HTTP+SSE clients, served through the endpoint's own handlers.
        legacy_sse = LegacySseEndpoint(settings, handlers, identifier, sealer, owner, forwarder, metrics)
    detector = relays.detector
    admin = Admin(
        settings,
        metrics,
        fresh=relays.fresh,
        probe=relays.ready,
        upstream_era=lambda: detector.era.value if detector.era is not None else "unknown",
        era_problem=relays.problem,
        clients=clients,
    )
    return Endpoints(forwarder, guard, discovery, verifier, endpoint, handlers, legacy_sse, admin)


def mount(
    app: web.Application, settings: Settings, metrics: Metrics, state: State, relays: Relays, endpoints: Endpoints
) -> web.Application:
    """The routes, and what tests and the CLI read from the application; returns the application
    the admin pages are on (`app` itself unless they listen separately)."""
    app[METRICS] = metrics
    app[LEGACY_TO_MODERN] = relays.legacy_to_modern
    app[MODERN_TO_LEGACY] = relays.modern_to_legacy
    if relays.process_sessions is not None:
        app[CONNECTION_SESSIONS] = relays.process_sessions
    app[DETECTOR] = relays.detector
    app[CACHE] = state.shared.cache
    if state.shared.tasks is not None:
        app[LEGACY_TASKS] = state.shared.tasks
    app[ADMIN] = endpoints.admin
    app[FORWARDER] = endpoints.forwarder
    guard, endpoint = endpoints.guard, endpoints.endpoint
    app.router.add_post(settings.path, safe(endpoint.post, guard))
    app.router.add_get(settings.path, safe(endpoint.get, guard))
    app.router.add_delete(settings.path, safe(endpoint.delete, guard))
    app.router.add_route("*", settings.path, safe(method_not_allowed, guard))
    legacy_sse = endpoints.legacy_sse
    if legacy_sse is not None:
        sse_config = settings.downstream.sse
        app.router.add_get(sse_config.path, safe(legacy_sse.stream, guard), allow_head=False)
        app.router.add_route("*", sse_config.path, safe(allowing("GET"), guard))
        app.router.add_post(sse_config.message_path, safe(legacy_sse.message, guard))
        app.router.add_route("*", sse_config.message_path, safe(allowing("POST"), guard))
    discovery = endpoints.discovery
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

    admin, admin_app = endpoints.admin, app if settings.admin_listen is None else web.Application()
    admin_app.router.add_get("/healthz", safe(admin.healthz))
    admin_app.router.add_get("/readyz", safe(admin.readyz))
    admin_app.router.add_get("/metrics", safe(admin.metrics))
    admin_app.router.add_get("/clients", safe(admin.clients))
    admin_app.router.add_get("/", safe(admin.status))
    for application in {id(app): app, id(admin_app): admin_app}.values():
        application.router.add_route("*", "/{tail:.*}", safe(not_found))  # JSON, never aiohttp's text page
    if settings.replicas.internal_listen is not None:
        from .cluster.replay import ReplayEndpoint, internal_app

        # Replays come from other replicas: Origin and Host were checked where the client connected.
        replayed = dict(endpoints.handlers)
        if legacy_sse is not None:
            replayed[SSE_MESSAGE_ROUTE] = safe(legacy_sse.message)
        replay = ReplayEndpoint(state.shared.sealer, state.owner, replayed)
        app[INTERNAL] = internal_app(replay, safe, settings.security.max_body_bytes)
    return admin_app


def add_lifecycle(
    app: web.Application, settings: Settings, state: State, relays: Relays, endpoints: Endpoints, tracing: Tracing
) -> None:
    """Start-up (housekeeping, the early era probe, the forwarder), the drain as shutdown begins,
    and the cleanup after it, in the order each depends on."""
    hosts = relays.hosts
    modern_to_legacy, detector, admin = relays.modern_to_legacy, relays.detector, endpoints.admin
    legacy_tasks = state.shared.tasks
    drain_deadline = [0.0]  # when parked calls must be given up (set as shutdown begins)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        pool = settings.upstream.pool
        pool_interval = min(max(min(pool.idle_timeout_s, pool.ping_interval_s) / 4, 0.25), 30.0)
        jobs: list[tuple[float, Callable[[], Awaitable[object]]]] = [
            (_reap_interval(h.idle_timeout_s, settings.sessions.max_lifetime_s), h.reap) for h in hosts
        ]
        jobs.append((pool_interval, modern_to_legacy.maintain))
        tasks = [asyncio.create_task(_every(interval, job)) for interval, job in jobs]
        tasks.append(asyncio.create_task(_detect_early(detector)))
        await endpoints.forwarder.start()
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await relays.watcher.close()
        await detector.close()  # an era probe still running (a stdio server starting)
        await admin.close()  # and a readiness probe
        if legacy_tasks is not None:
            await legacy_tasks.close()  # tasks still running fail ("the proxy shut down")
        for host in hosts:
            await host.close_all()
        await relays.translating.settle_cancels()  # upstream tasks given up while closing
        left = await modern_to_legacy.settle(max(0.0, drain_deadline[0] - time.monotonic()))
        if left:
            log.warning("calls_cut_at_shutdown", calls=left)
        await modern_to_legacy.close_all()
        await relays.edge.close()
        await endpoints.forwarder.close()
        if endpoints.verifier is not None:
            await endpoints.verifier.close()
        if state.owned_store is not None:
            await state.owned_store.aclose()
        await endpoints.discovery.close()
        await tracing.shutdown()  # the spans of the calls that ended above are exported too

    async def drain(app: web.Application) -> None:
        """Shutdown begins (sites stopped): not ready any more; streams end gracefully now, calls in
        flight get `shutdown.grace_s`, then the endpoint cuts the rest with an error that says so,
        before the cleanup below."""
        admin.draining = True
        drain_deadline[0] = time.monotonic() + settings.shutdown.grace_s
        for host in hosts:
            host.end_streams()
        modern_to_legacy.end_streams()
        relays.same_era.end_streams()
        if endpoints.legacy_sse is not None:
            endpoints.legacy_sse.end_streams()
        # One grace, the proxy's own: the calls still running after it get an error that says so
        # (aiohttp's own wait, after this, finds them answered; docs/operate/kubernetes.md, "Probes and shutdown").
        await endpoints.endpoint.drain(settings.shutdown.grace_s)

    app.on_shutdown.append(drain)
    app.cleanup_ctx.append(lifecycle)
    if endpoints.legacy_sse is not None:
        sse_endpoint = endpoints.legacy_sse

        async def sse_lifecycle(app: web.Application) -> AsyncIterator[None]:
            # After the relays start, before they close: its streams end while they still serve.
            await sse_endpoint.start()
            yield
            await sse_endpoint.close()

        app.cleanup_ctx.append(sse_lifecycle)


async def detect_sse_upstream(settings: Settings, session: aiohttp.ClientSession | None = None) -> Settings:
    """`settings` with upstream.url turned into upstream.sse_url when it is a 2024-11-05 HTTP+SSE
    server's SSE URL (upstream/sse.py serves_sse; upstream.sse.detect), else as they are. Asked
    once, at start: an upstream not answering then stays Streamable HTTP."""
    config = settings.upstream
    if config.url is None or config.era == "modern" or not config.sse.detect:
        return settings
    from .upstream.sse import SseConnector, serves_sse

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


async def _detect_early(detector: EraDetector) -> None:
    """Learn the upstream's era at start, so the first request does not wait for it."""
    try:
        await detector.current(needs=False)  # brings nothing: a client's initialize may come
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
