"""The one host of the legacy sessions the proxy holds for its clients, with pluggable backends.

The host mints, resolves, expires, reaps and closes sessions, keeps their live runtime (GET
streams, requests in flight, server-to-client requests awaited), counts and logs them. What
differs per upstream is a backend:

- relay.legacy_to_modern.TranslatingBackend: a modern upstream; every request is translated;
- relay.connection_sessions.ProcessBackend: a legacy stdio or HTTP+SSE upstream; each session is a
  server process or an SSE connection.

Session records go through the SessionStore; live runtimes stay with the replica that holds them.
Spec: 2025-11-25/basic/lifecycle.mdx, 2025-11-25/basic/transports.mdx §Session Management.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import structlog

from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..state.sessions import (
    LegacySession,
    SessionCore,
    SessionIds,
    SessionStore,
    StoreUnavailable,
    core_fits_in_id,
    short_hash,
)
from .channel import ReplyChannel
from .runtime import GetStream, SessionRuntime
from .scopes import CancelScope, TaskScope

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)
_STREAM_READY_S = 5.0  # how long a new GET stream waits for the upstream listen's acknowledgement
L = TypeVar("L")
_SEEN_RESOLUTION_S = 1.0  # how finely a session's last use is recorded (idle expiry is in minutes)


@dataclass(slots=True)
class Opened(Generic[L]):
    """What a backend made of an `initialize`: the result for the client, the session's facts, and
    the backend's live part of the session (None: nothing is live yet; `revive` makes it on first
    use, so an idle session costs only its record)."""

    result: JSONDict
    legacy_version: str
    live: L | None
    modern_version: str = ""
    upstream_capabilities: JSONDict = field(default_factory=dict)
    server_capabilities: JSONDict = field(default_factory=dict)
    log_fields: JSONDict = field(default_factory=dict)


class LegacyBackend(Protocol[L]):
    """What differs between the upstreams a legacy session can stand for."""

    @property
    def durable(self) -> bool:
        """Whether a session outlives its runtime here (its state is in the store, not in a process)."""

    async def open(self, message: JSONDict, principal: str, auth_headers: dict[str, str]) -> Opened[L]:
        """Answer the `initialize` request `message`; raises ProxyError when it cannot."""

    def started(self, runtime: SessionRuntime[L], lost: Callable[[str], None]) -> None:
        """The session holds `runtime` now; `lost(reason)` closes it should the backend lose it."""

    def revive(self, session: LegacySession) -> L | None:
        """A fresh live part for a stored session this replica holds no runtime for; None: the
        session cannot be served (its process is gone)."""

    async def request(
        self,
        session: LegacySession,
        runtime: SessionRuntime[L],
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        """Run one client request to its final message."""

    async def resume(
        self,
        session: LegacySession,
        runtime: SessionRuntime[L],
        request_id: Any,
        seen_seq: int,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict | None:
        """Carry on a request whose stream broke on another replica, if its state allows; None: it
        cannot be carried on (the client gets its error)."""

    async def notify(self, session: LegacySession, runtime: SessionRuntime[L], message: JSONDict) -> None:
        """A client notification (the host has already done its own part)."""

    async def respond(self, session: LegacySession, runtime: SessionRuntime[L], message: JSONDict) -> bool:
        """A client's reply to a server-to-client request; False if nothing waited for it."""

    def get_stream_opened(
        self, session: LegacySession, runtime: SessionRuntime[L], moved: bool, auth_headers: dict[str, str] | None
    ) -> asyncio.Future[Any] | None:
        """The session opened a GET stream (it wants what the server says unasked); `moved`: its
        last one was on another replica, so what was said meanwhile may be lost; `auth_headers`:
        the credentials the GET came with (the caller's latest, a refreshed token perhaps).
        Returns what the stream waits for before it is answered (the upstream listen that feeds
        it being acknowledged), or None."""

    async def close(self, runtime: SessionRuntime[L]) -> None:
        """The session ended here: release its live part."""


class LegacySessionHost(Generic[L]):
    def __init__(
        self,
        backend: LegacyBackend[L],
        settings: Settings,
        store: SessionStore,
        ids: SessionIds,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        *,
        max_live: int | None = None,
        idle_timeout_s: float | None = None,
        owner: str = "",
    ) -> None:
        """`max_live`: runtimes held at most, least recently used first out (a backend whose live
        part is a process); `idle_timeout_s`: the idle expiry, when shorter than the sessions'."""
        self.backend = backend
        self.owner = owner  # how this replica names itself in session.stream_owner
        self._settings = settings
        self._limits = settings.sessions
        self._store = store
        self._ids = ids
        self._metrics = metrics
        self._clock = clock
        self._runtimes: dict[str, SessionRuntime[L]] = {}  # least recently used first when bounded
        self._max_live = max_live
        self._opening = 0  # sessions being opened: their runtime counts against max_live already
        self.idle_timeout_s = min(idle_timeout_s or self._limits.idle_timeout_s, self._limits.idle_timeout_s)
        self.tasks = TaskScope("legacy sessions")

    # ------------------------------------------------------------ sessions

    async def initialize(self, message: JSONDict, principal: str, auth_headers: dict[str, str]) -> tuple[JSONDict, str]:
        """Answer `initialize` and mint a session bound to the caller."""
        params = message.get("params")
        if not isinstance(params, dict):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "initialize needs params")
        if self._store.count() >= self._limits.max_sessions:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many sessions", status=503, outcome="rejected")
        self._opening += 1
        try:
            if self._max_live is not None:
                await self._make_room(self._max_live)
            return await self._open(message, params, principal, auth_headers)
        finally:
            self._opening -= 1

    async def _open(
        self, message: JSONDict, params: JSONDict, principal: str, auth_headers: dict[str, str]
    ) -> tuple[JSONDict, str]:
        opened = await self.backend.open(message, principal, auth_headers)
        now = self._clock()
        client_info = params.get("clientInfo")
        core = SessionCore(
            legacy_version=opened.legacy_version,
            modern_version=opened.modern_version,
            client_capabilities=jsonrpc.obj(params.get("capabilities")),
            upstream_capabilities=opened.upstream_capabilities,
            server_capabilities=opened.server_capabilities,
            client_info=client_info if isinstance(client_info, dict) else None,
        )
        session = LegacySession.from_core(
            self._ids.mint(principal, core),
            principal,
            core,
            created_at=now,
            last_seen=now,
            log_level=self._limits.default_log_level,
            core_in_store=not core_fits_in_id(core),
        )
        try:
            await self._store.add(session)
        except StoreUnavailable:
            # Served all the same: the id says the record is missing, so any replica that finds
            # none brings the session back with the defaults instead of answering 404.
            if session.core_in_store:
                raise  # the id cannot carry it and the store cannot take it
            session.recorded = False
            session.id = self._ids.mint(principal, session.core)
            log.warning("session_not_recorded", reason="store unavailable")
        if opened.live is not None:
            self._attach(session.id, opened.live)
        self._metrics.sessions_open.labels("legacy").set(self._store.count())
        log.info(
            "session_opened",
            session=short_hash(session.id),
            legacy_version=session.legacy_version,
            client=(session.client_info or {}).get("name"),
            **opened.log_fields,
        )
        return opened.result, session.id

    async def _make_room(self, max_live: int) -> None:
        """At the bound, the least recently used idle session gives its runtime up (a process: the
        session ends, and its client gets 404 and starts a new one); with none idle, 503."""
        while len(self._runtimes) + self._opening > max_live:
            idle = next((sid for sid, runtime in self._runtimes.items() if not runtime.busy), None)
            if idle is None:
                raise ProxyError(
                    jsonrpc.LIMIT_EXCEEDED,
                    f"all {max_live} upstream processes are busy serving sessions; try again later",
                    status=503,
                    outcome="rejected",
                )
            if self.backend.durable:
                await self._release(self._runtimes.pop(idle))  # made again on the session's next request
            else:
                await self.close(idle, reason="evicted")

    async def resolve(self, session_id: str, principal: str) -> LegacySession | None:
        """The live session for this id and caller, or None (→ HTTP 404)."""
        opened = self._ids.open(session_id, principal)
        if opened is None:
            return None
        now = self._clock()
        session = self._store.held(session_id)
        if session is None:
            described = LegacySession.from_id(session_id, principal, opened, now, self._limits.default_log_level)
            session = await self._store.load(described)
        if session is None or session.principal != principal:
            if self._runtimes.get(session_id) is not None and not self._busy(session_id):
                await self._release(self._runtimes.pop(session_id))  # ended elsewhere
            return None
        if now - session.last_seen > self.idle_timeout_s and not self._busy(session_id):
            await self.close(session_id, reason="expired")
            return None
        runtime = self._runtime(session)
        if runtime is None:
            return None  # a session whose runtime cannot be rebuilt here (its process is gone)
        runtime.last_used = now
        runtime.session = session  # the latest state: what the live parts read
        if session.initialized and not runtime.initialized:
            runtime.mark_initialized()  # the client said so to another replica
        if self._max_live is not None:  # the most recently used last
            self._runtimes[session_id] = self._runtimes.pop(session_id)
        if not self._store.shared and now - session.last_seen >= _SEEN_RESOLUTION_S:  # not a write per request
            session.last_seen = now
            await self._store.save(session)
        return session

    def _runtime(self, session: LegacySession) -> SessionRuntime[L] | None:
        runtime = self._runtimes.get(session.id)
        if runtime is None:
            live = self.backend.revive(session)
            if live is None:
                return None
            runtime = self._attach(session.id, live)
            if session.initialized:
                runtime.mark_initialized()
        return runtime

    def _attach(self, session_id: str, live: L) -> SessionRuntime[L]:
        runtime = SessionRuntime(session_id, live, self._limits.notification_buffer)
        self._runtimes[session_id] = runtime
        self.backend.started(runtime, lambda reason: self.closed_by_backend(session_id, reason))
        return runtime

    def _busy(self, session_id: str) -> bool:
        runtime = self._runtimes.get(session_id)
        return runtime is not None and runtime.busy

    async def close(self, session_id: str, *, reason: str) -> bool:
        try:
            held = await self._store.remove(session_id)
        except StoreUnavailable:
            held = False  # ended here; elsewhere it ends with its idle timeout
            log.warning("session_close_not_shared", session=short_hash(session_id), reason="store unavailable")
        runtime = self._runtimes.pop(session_id, None)
        if runtime is not None:
            await self._release(runtime)
        if not held and runtime is None:
            return False
        self._metrics.sessions_open.labels("legacy").set(self._store.count())
        if reason == "expired":
            self._metrics.sessions_expired.inc()
        log.info("session_closed", session=short_hash(session_id), reason=reason)
        return True

    def closed_by_backend(self, session_id: str, reason: str) -> None:
        """The backend lost the session (its process exited): close it."""
        if session_id in self._runtimes and not self.tasks.closed:
            self.tasks.spawn(self.close(session_id, reason=reason), name="session-close")

    async def _release(self, runtime: SessionRuntime[L]) -> None:
        runtime.close()
        await runtime.tasks.aclose()
        await self.backend.close(runtime)

    async def reap(self) -> int:
        """Close sessions past their lifetime, then idle ones: those with nothing open or in flight
        (a busy one counts as seen now, so it is not reaped the moment it goes idle). With a shared
        store, the store's TTL ends idle sessions; here only live parts unused for as long go."""
        now = self._clock()
        closed = 0
        for session_id in await self._store.created_before(now - self._limits.max_lifetime_s):
            closed += await self.close(session_id, reason="expired")
        for session_id in await self._store.idle_since(now - self.idle_timeout_s):
            if self._busy(session_id):
                await self._store.touch(session_id, now)
                continue
            closed += await self.close(session_id, reason="expired")
        if self._store.shared:
            for session_id, runtime in list(self._runtimes.items()):
                if runtime.busy:  # an open stream keeps its session alive everywhere
                    runtime.last_used = now
                    await self._touch_shared(session_id, now)
                elif now - runtime.last_used > self.idle_timeout_s:
                    await self._release(self._runtimes.pop(session_id))
            self._metrics.sessions_open.labels("legacy").set(self._store.count())
        return closed

    async def _touch_shared(self, session_id: str, now: float) -> None:
        try:
            await self._store.touch(session_id, now)
        except StoreUnavailable:
            pass  # the next sweep tries again; the TTL is far longer than the sweep interval

    def end_streams(self) -> None:
        """Shutdown begins: end every GET stream; calls in flight may still finish."""
        for runtime in self._runtimes.values():
            runtime.end_streams()

    async def close_all(self) -> None:
        """Shutdown: release every runtime. A session that cannot outlive it here is closed; a
        durable one stays in the store, for this replica's successor or another one."""
        await self.tasks.aclose()
        for session_id in list(self._runtimes):
            if self.backend.durable:
                await self._release(self._runtimes.pop(session_id))
            else:
                await self.close(session_id, reason="shutdown")

    # ------------------------------------------------------------ messages in a session

    async def handle_notification(self, session: LegacySession, message: JSONDict) -> None:
        method = message["method"]
        runtime = self._runtimes.get(session.id)
        if method == "notifications/initialized":
            if not session.initialized:
                session.initialized = True
                try:
                    await self._store.save(session, ("initialized",))
                except StoreUnavailable:
                    # Only what waits on it here is affected; other replicas wait at most
                    # input.initialized_wait_s before going on.
                    log.warning("session_initialized_not_shared", session=short_hash(session.id))
            if runtime is not None:
                runtime.mark_initialized()
        if runtime is None:
            return
        await self.backend.notify(session, runtime, message)
        if method == "notifications/cancelled":
            scope = runtime.inflight.get(jsonrpc.params_of(message).get("requestId"))
            if scope is not None:
                scope.cancel()  # the request ends without a reply (cancellation: no response)

    async def handle_response(self, session: LegacySession, message: JSONDict) -> bool:
        """A client's answer to a server-to-client request; False if nothing waited for it."""
        runtime = self._runtimes.get(session.id)
        return runtime is not None and await self.backend.respond(session, runtime, message)

    async def handle_request(
        self, session: LegacySession, message: JSONDict, channel: ReplyChannel, auth_headers: dict[str, str]
    ) -> JSONDict | None:
        """Run one client request to completion; None when the client cancelled it."""
        runtime = self._runtime(session)
        if runtime is None:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, "the session can no longer be served here")
        request_id = message["id"]
        if len(runtime.inflight) >= self._limits.max_inflight_requests:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many concurrent requests in this session")
        if request_id in runtime.inflight:
            raise ProxyError(jsonrpc.INVALID_REQUEST, f"request id {request_id!r} is already in flight")
        with CancelScope() as scope:
            runtime.inflight[request_id] = scope
            try:
                return await self.backend.request(session, runtime, message, channel, auth_headers)
            finally:
                if runtime.inflight.get(request_id) is scope:
                    del runtime.inflight[request_id]
        return None  # cancelled by the client

    async def resume(
        self,
        session: LegacySession,
        request_id: Any,
        seen_seq: int,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict | None:
        """A client resumed the broken stream of `request_id` here: its final message, when the
        request could be carried on; None when it cannot (or the client cancelled it)."""
        runtime = self._runtime(session)
        if runtime is None or request_id in runtime.inflight:
            return None
        with CancelScope() as scope:
            runtime.inflight[request_id] = scope
            try:
                return await self.backend.resume(session, runtime, request_id, seen_seq, channel, auth_headers)
            finally:
                if runtime.inflight.get(request_id) is scope:
                    del runtime.inflight[request_id]
        return None

    async def stream_holder(self, session: LegacySession) -> str:
        """Which replica holds the session's GET stream now (read again from a shared store)."""
        if not self._store.shared:
            return session.stream_owner
        try:
            await self._store.load(session)
        except StoreUnavailable:
            pass
        return session.stream_owner

    async def offer_answer(self, session: LegacySession, message: JSONDict) -> str | None:
        """An answer nothing here awaits: the replica carrying its round on, if one does (else it
        is kept for the replica that will)."""
        server_id = message.get("id")
        if not self._store.shared or not isinstance(server_id, str):
            return None
        try:
            return await self._store.offer_answer(
                session.id, server_id, jsonrpc.encode(message), self._settings.input.round_timeout_s
            )
        except StoreUnavailable:
            return None

    # ------------------------------------------------------------ GET streams

    async def open_get_stream(self, session: LegacySession, auth_headers: dict[str, str] | None = None) -> GetStream:
        runtime = self._runtime(session)
        if runtime is None:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, "the session can no longer be served here")
        stream = runtime.open_stream(self._limits.max_get_streams)
        previous = session.stream_owner
        if self._store.shared and previous != self.owner:
            session.stream_owner = self.owner
            try:
                await self._store.save(session, ("stream_owner",))
                # Read again after saying so: a subscription another replica made meanwhile is
                # either seen here now, or that replica sees this one holding the stream and
                # hands the subscription over (downstream/legacy_http.py).
                await self._store.load(session)
            except StoreUnavailable:
                log.warning("stream_owner_not_shared", session=short_hash(session.id))
            runtime.session = session
        ready = self.backend.get_stream_opened(
            session, runtime, bool(previous) and previous != self.owner, auth_headers
        )
        if ready is not None:
            # Answered once what feeds it listens (bounded): a client that waits for its stream
            # before it changes anything misses no notification of the change.
            await asyncio.wait({ready}, timeout=_STREAM_READY_S)
        return stream

    def close_get_stream(self, session_id: str, stream: GetStream) -> None:
        runtime = self._runtimes.get(session_id)
        if runtime is not None:
            runtime.detach(stream)
