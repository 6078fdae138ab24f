"""The relays assembled over one upstream edge: era detection, the relay of each era pairing, the
routing table over them, and the cache's own watch of the upstream. Every collaborator is given at
construction; the two construction cycles are closed with a LateCallback (below)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, ParamSpec

from .. import PROXY_INFO
from ..config import Settings, SseTarget
from ..metrics import Metrics
from ..protocol import modern_to_legacy as m2l
from ..protocol.request_state import RequestStateCodec
from ..protocol.versions import Era
from ..state.cache import ResponseCache
from ..state.sealing import Sealer
from ..state.sessions import InMemorySessionStore, SessionIds, SessionStore
from ..upstream.edge import UpstreamEdge
from ..upstream.errors import UpstreamHTTPError
from ..upstream.stdio import StdioChannel
from .binding import CallerBinding
from .bytes import ByteRelay
from .cache_watch import CacheWatcher
from .connection_sessions import Process, ProcessBackend
from .detect import EraDetector, Handshakes, Probe, probe_http, probe_stdio
from .failures import UpstreamFailures
from .legacy_sessions import LegacySessionHost
from .legacy_to_modern import TranslatingBackend
from .modern_to_legacy import ModernToLegacy
from .modern_to_legacy import probe as probe_legacy
from .passthrough import ModernPassThrough
from .routes import Router, routing_table
from .session_listens import Translated
from .tasks.host import LegacyTaskHost

P = ParamSpec("P")


class LateCallback(Generic[P]):
    """A callback to an object built after the one that calls it, bound once when that one exists.

    Only for a true construction cycle, where each of two objects needs the other: the cache tells
    the watcher what it stored, and the watcher reads the cache (and the relays that use it); the
    era detector tells the cache and the watcher that the era changed, and the watcher asks the
    detector for the era. The caller is built with this, the callee after it, then `bind` closes
    the loop. Called before it is bound, or bound twice, it raises: a wiring mistake shows at once
    rather than as a call that silently went nowhere."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._target: Callable[P, None] | None = None

    def bind(self, target: Callable[P, None]) -> None:
        if self._target is not None:
            raise RuntimeError(f"{self._name}: bound twice")
        self._target = target

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        target = self._target
        if target is None:
            raise RuntimeError(f"{self._name}: called before it was bound")
        target(*args, **kwargs)


@dataclass(frozen=True)
class Relays:
    edge: UpstreamEdge
    failures: UpstreamFailures
    detector: EraDetector
    translating: TranslatingBackend  # legacy clients, modern upstream: the backend of legacy_to_modern
    legacy_to_modern: LegacySessionHost[Translated]  # legacy sessions held here, translated
    process_sessions: LegacySessionHost[Process] | None  # legacy sessions, a server process (connection) each
    same_era: ModernPassThrough
    modern_to_legacy: ModernToLegacy
    byte_relay: ByteRelay | None
    router: Router
    watcher: CacheWatcher
    handshakes: Handshakes  # whether the era's handshake works now: what readiness reports
    window_s: float  # readiness.window_s: a handshake that worked within it counts

    @property
    def hosts(self) -> list[LegacySessionHost[Translated] | LegacySessionHost[Process]]:
        """The legacy session hosts: each reaps, ends its streams and closes its sessions."""
        hosts: list[LegacySessionHost[Translated] | LegacySessionHost[Process]] = [self.legacy_to_modern]
        if self.process_sessions is not None:
            hosts.append(self.process_sessions)
        return hosts

    def fresh(self) -> bool:
        """The era's handshake worked within readiness.window_s (a 2026-07-28 stdio server's counts
        only while its one process runs)."""
        stdio = self.edge.stdio
        if stdio is not None and self.detector.era is Era.MODERN and not stdio.healthy:
            return False
        worked = self.handshakes.worked_at
        return worked is not None and time.monotonic() - worked < self.window_s

    def problem(self) -> str | None:
        """Why the upstream cannot serve now: it answers as the other era than the one configured,
        or its era's handshake fails."""
        return self.detector.mismatch or self.handshakes.failing

    async def ready(self) -> None:
        """Readiness: the era's handshake, as a new client's would go (a legacy `initialize` and
        its end, or `server/discover`); any failure is said until one works."""
        try:
            era = await self.detector.current()
            if self.handshakes.failing is None and self.fresh():
                return  # the era probe's own handshake, or a request's, worked meanwhile
            if era is Era.MODERN:
                await self.translating.probe()
            else:
                await probe_legacy(self.modern_to_legacy, fresh=self.edge.http is not None)
        except UpstreamHTTPError as exc:
            if exc.status not in (401, 403):
                self.handshakes.failed(exc)
                raise
            # It answered: an OAuth-protected upstream refuses a probe without a caller's token,
            # and is as ready as it will be (its era is learnt with the first caller's).
        except Exception as exc:
            self.handshakes.failed(exc)
            raise
        self.handshakes.worked()
        self.detector.confirm()  # it serves the era it is taken for


@dataclass(frozen=True)
class Shared:
    """What the relays use from the state that outlives a request (app.py build_state)."""

    sealer: Sealer
    ids: SessionIds
    store: SessionStore
    cache: ResponseCache
    cache_stored: LateCallback[[str | None]]  # the cache's on_store, bound here to the watcher
    codec: RequestStateCodec
    server_ids: Callable[[str, int], str | int]
    tasks: LegacyTaskHost | None
    owner: str  # how this replica names itself in the records it shares


def build_relays(
    settings: Settings, edge: UpstreamEdge, shared: Shared, metrics: Metrics, clock: Callable[[], float]
) -> Relays:
    """The relays over `edge`, on the state in `shared`; binds the cache's `cache_stored` to the watcher."""
    resource_server = settings.auth.mode == "resource_server"
    failures = UpstreamFailures(metrics, own_credentials=resource_server)
    # resource_server: the upstream sees only the proxy's credentials, so the proxy binds a same-era
    # upstream's session ids and requestState to the caller (relay/binding.py).
    binding = (
        CallerBinding(shared.sealer, max_state_chars=settings.security.max_body_bytes) if resource_server else None
    )
    config = settings.upstream
    handshakes = Handshakes(config.name)
    era_changed = LateCallback[[Era]]("era changed")
    configured = "legacy" if isinstance(edge.target, SseTarget) else config.era
    probe = _probe(edge, config.name, config.era_probe_timeout_s, handshakes)
    detector = EraDetector(configured, probe, on_change=era_changed)
    byte_relay = None
    if edge.http is not None:
        byte_relay = ByteRelay(edge.http, failures, config.request_timeout_s, binding, on_era_mismatch=detector.suspect)
    process_sessions = None
    if edge.processes is not None:
        # A session that is a process (or an SSE connection) cannot be shared with other replicas:
        # it lives here only. It is bounded in number and ended sooner when idle than a session
        # record expires.
        process_sessions = LegacySessionHost(
            ProcessBackend(settings, edge.processes.make, config.name, failures, edge.handover, handshakes),
            settings,
            InMemorySessionStore(),
            shared.ids,
            metrics,
            clock,
            max_live=edge.processes.max_live,
            idle_timeout_s=edge.processes.idle_s,
        )
    cache = shared.cache
    translating = TranslatingBackend(
        settings,
        edge.modern,
        shared.store,
        metrics,
        cache,
        failures,
        server_ids=shared.server_ids,
        tasks=shared.tasks,
        claimant=shared.owner,
        on_era_mismatch=detector.suspect,
        handshakes=handshakes,
    )
    legacy_to_modern = LegacySessionHost(
        translating, settings, shared.store, shared.ids, metrics, clock, owner=shared.owner
    )
    same_era = ModernPassThrough(settings, edge.modern, metrics, cache, failures, binding)
    modern_to_legacy = ModernToLegacy(
        settings,
        edge.legacy_sessions,
        metrics,
        shared.codec,
        clock,
        cache=cache,
        failures=failures,
        tasks=shared.tasks,
        on_era_mismatch=detector.suspect,
        handshakes=handshakes,
    )
    router = routing_table(
        edge.target.kind,
        translating=legacy_to_modern,
        process_sessions=process_sessions,
        same_era=same_era,
        modern_to_legacy=modern_to_legacy,
        byte_relay=byte_relay,
    )
    watcher = CacheWatcher(settings, cache, detector, translating, modern_to_legacy)
    shared.cache_stored.bind(watcher.watch)
    era_changed.bind(partial(_era_changed, cache, watcher))
    return Relays(
        edge,
        failures,
        detector,
        translating,
        legacy_to_modern,
        process_sessions,
        same_era,
        modern_to_legacy,
        byte_relay,
        router,
        watcher,
        handshakes,
        settings.readiness.window_s,
    )


def _probe(edge: UpstreamEdge, name: str, timeout_s: float, handshakes: Handshakes) -> Probe:
    """The era probe: server/discover over HTTP, or on a process started for it, whose legacy
    `initialize` is, unless a client's own set the probe off, the one a pooled session of no
    capabilities sends (readiness's: it then takes the probe's process from the handover). A stdio
    probe whose process is kept was a handshake that worked (a discover the server answered, or an
    `initialize`): readiness needs no process of its own for it."""
    if edge.http is not None:
        return partial(probe_http, edge.http, timeout_s)
    assert edge.processes is not None
    make = edge.processes.make

    async def probe_channel() -> StdioChannel:
        channel = StdioChannel(make, name)
        await channel.start()
        return channel

    default_hello = m2l.initialize_request("era-probe-initialize", {}, PROXY_INFO)
    if edge.handover is None:
        return partial(probe_stdio, probe_channel, timeout_s, default_hello=default_hello)
    hold = edge.handover.hold

    def keep(
        channel: StdioChannel, *, modern: bool, hello: dict[str, Any] | None, answer: dict[str, Any] | None
    ) -> bool:
        if modern or (answer is not None and "result" in answer):
            handshakes.worked()
        return hold(channel, modern=modern, hello=hello, answer=answer)

    return partial(probe_stdio, probe_channel, timeout_s, default_hello=default_hello, keep=keep)


def _era_changed(cache: ResponseCache, watcher: CacheWatcher, era: Era) -> None:
    cache.clear("era_changed")
    watcher.reset()
