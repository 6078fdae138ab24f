"""Sessions the proxy holds with a legacy upstream, over either transport, and the pool that shares them.

A modern client declares its capabilities per request; a legacy server fixes them per session.
So sessions are keyed by (caller, capabilities) and shared only within a key. An interactive
call (one that may draw server-to-client requests) gets a session to itself while it runs, so
every server request the session receives outside a reply can be attributed to exactly one call.
docs/translation.md §4.3.

The transport is a constructor argument: Streamable HTTP (session id and version headers, a GET
stream for what the server starts, DELETE at the end) or stdio (the session is a process whose
stdout carries everything); both are in session_transports.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import structlog

from .. import PROXY_INFO
from ..config import PoolConfig
from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol import modern_to_legacy as m2l
from ..protocol.capabilities import modern_server_capabilities
from .base import Reply
from .errors import UpstreamError, UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from .http import HttpUpstream
from .session_transports import HttpSessionTransport, SessionTransport, StdioSessionTransport
from .stdio import ProbeHandover, StdioProcess

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)


class SessionOwner(Protocol):
    """Who handles what a legacy session receives outside a request's own reply."""

    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None: ...
    def on_notification(self, session: LegacyUpstreamSession, note: JSONDict) -> None: ...


class CallSink(Protocol):
    """A call running on a session: what the owner hands the server's requests, notifications and
    progress to when they come outside the call's own reply (the relay's calls implement it)."""

    @property
    def finished(self) -> bool:
        """The call is over: nothing more goes to it."""

    def takes(self, request: JSONDict) -> bool:
        """Whether a server request that came outside any reply is this call's."""


class LegacyUpstreamSession:
    """One legacy session with the upstream."""

    def __init__(
        self,
        transport: SessionTransport,
        key: tuple[str, str],
        capabilities: JSONDict,
        auth_headers: dict[str, str],
        owner: SessionOwner,
        clock: Callable[[], float] = time.monotonic,
        *,
        initialize_timeout_s: float,  # upstream.initialize_timeout_s
    ) -> None:
        self.transport = transport
        self._initialize_timeout_s = initialize_timeout_s
        self.name = transport.name
        self.key = key
        self.capabilities = capabilities  # the modern clientCapabilities this session was opened for
        self.auth_headers = auth_headers
        self.owner = owner
        self._clock = clock
        self.id: str | None = None
        self.version = ""
        self.initialize_result = {}
        # The next request id: a bound method of the count, so taking one runs no Python frame.
        self.next_id: Callable[[], int] = itertools.count(1).__next__
        self.exclusive: CallSink | None = None  # the interactive call that owns this session, if any
        self.inflight = 0
        self.last_used = clock()
        self.log_level: str | None = None
        self.push_channel = False  # what the server starts can reach the proxy
        self.closed = False
        self.progress_routes: dict[str, CallSink] = {}  # upstream progress token -> call
        self.active: set[CallSink] = set()  # calls running on this session

    # ------------------------------------------------------------ wire

    def headers(self) -> dict[str, str]:
        return self.transport.headers(self)

    def request(
        self, message: JSONDict, extra_headers: Mapping[str, str] | None = None
    ) -> AbstractAsyncContextManager[Reply]:
        """Send a request on the session; entering yields its reply, leaving closes it. A request
        that cannot be sent at all fails as an UpstreamError on entering."""
        return _Sending(self.name, self.exchange(message, extra_headers))

    def exchange(
        self, message: JSONDict, extra_headers: Mapping[str, str] | None = None
    ) -> AbstractAsyncContextManager[Reply]:
        """`request` without its wrapper, for a caller that maps what entering raises itself (as
        `unsendable`): the relay's calls, which would otherwise pay a coroutine level per resume."""
        self.last_used = self._clock()
        transport = self.transport
        headers = transport.headers(self)
        if extra_headers:
            headers = {**headers, **extra_headers}
        return transport.exchange(message, headers)

    async def send(self, message: JSONDict) -> None:
        """Send a notification or a response to one of the server's requests."""
        self.last_used = self._clock()
        try:
            await self.transport.send(message, self.headers())
        except (UpstreamError, TimeoutError):
            raise
        except Exception as exc:
            raise unsendable(self.name, exc) from None

    async def call(self, method: str, params: JSONDict | None = None, timeout_s: float = 30.0) -> JSONDict:
        """A plain request whose reply matters only as a result (ping, setLevel, subscribe)."""
        request_id = self.next_id()
        async with asyncio.timeout(timeout_s), self.request(jsonrpc.request(request_id, method, params)) as reply:
            async for message in reply:
                if "method" in message:
                    self.dispatch(message)
                    continue
                if "error" in message:
                    error = jsonrpc.obj(message["error"])
                    code = error.get("code")
                    raise ProxyError(
                        code if isinstance(code, int) else jsonrpc.INTERNAL_ERROR,
                        str(error.get("message")),
                        data=error.get("data"),
                    )
                return jsonrpc.obj(message.get("result"))
        raise UpstreamProtocolError(self.name, f"sent no reply to {method}")

    def dispatch(self, message: JSONDict) -> None:
        """What the server sends outside a request's reply goes to the owner."""
        if "method" not in message:
            return
        if "id" in message:
            self.owner.on_server_request(self, message)
        else:
            self.owner.on_notification(self, message)

    # ------------------------------------------------------------ lifecycle

    async def open(self, client_info: JSONDict | None, *, push_wait_s: float = 0.0) -> None:
        """initialize, notifications/initialized, then what carries the messages the server starts."""
        message = m2l.initialize_request(self.next_id(), self.capabilities, client_info or PROXY_INFO)
        answered = await self.transport.start(self, message)  # the era probe's process: answered already
        if answered is None:
            answered = await self._initialize(message)
        if "error" in answered:
            error = jsonrpc.obj(answered["error"])
            raise ProxyError(
                jsonrpc.INTERNAL_ERROR,
                f"upstream refused initialize: {error.get('message')}",
                data={"upstreamError": error},
            )
        result = answered.get("result")
        try:
            self.initialize_result = m2l.check_initialize_result(result)
        except m2l.InitializeRejected as exc:
            raise UpstreamProtocolError(self.name, str(exc)) from None
        self.version = self.initialize_result["protocolVersion"]
        await self.send(jsonrpc.notification("notifications/initialized"))
        self.push_channel = await self.transport.open_push(self, push_wait_s)

    async def _initialize(self, message: JSONDict) -> JSONDict:
        """The server's answer to `initialize` (an empty one when the reply held none)."""
        exchange = _Sending(self.name, self.transport.exchange(message, self.auth_headers))
        try:
            async with asyncio.timeout(self._initialize_timeout_s), exchange as reply:
                self.transport.adopt(self, reply)
                async for incoming in reply:
                    if "method" not in incoming:
                        return incoming
        except TimeoutError:
            # Silence (a server that hangs, or writes nothing but lines that are not JSON-RPC).
            raise UpstreamTimeout(
                self.name, f"did not answer initialize within {self._initialize_timeout_s:g} s"
            ) from None
        return {}

    @property
    def initialize_result(self) -> JSONDict:
        return self._initialize_result

    @initialize_result.setter
    def initialize_result(self, result: JSONDict) -> None:
        """What every request reads of the server's InitializeResult is read once, here."""
        self._initialize_result = result
        caps = result.get("capabilities")
        self.server_capabilities: JSONDict = caps if isinstance(caps, dict) else {}
        # The server's capabilities in the modern shape (docs/translation.md §4.2).
        self.modern_capabilities: JSONDict = modern_server_capabilities(self.server_capabilities)
        # It takes task-augmented tools/call (asked of every tools/call on the session).
        self.tool_calls_as_tasks = m2l.runs_tool_calls_as_tasks(self.server_capabilities)
        info = result.get("serverInfo")
        self.server_info: JSONDict | None = info if isinstance(info, dict) else None

    async def close(self, *, delete: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        await self.transport.end(self, delete=delete)


def unsendable(upstream: str, exc: Exception) -> UpstreamUnavailable:
    """A message that could not be sent at all (not encodable, refused by the HTTP client): a
    failed exchange like any other, so that the call it belongs to fails now, not at its deadline."""
    log.warning("upstream_message_unsendable", upstream=upstream, error=f"{exc.__class__.__name__}: {exc}"[:300])
    return UpstreamUnavailable(upstream, f"could not be sent the request ({exc.__class__.__name__})")


class _Sending:
    """An exchange whose entering (encoding and sending the request) fails only as UpstreamError.
    A class rather than a generator: it wraps every request on a legacy session."""

    __slots__ = ("_exchange", "_upstream")

    def __init__(self, upstream: str, exchange: AbstractAsyncContextManager[Reply]) -> None:
        self._upstream = upstream
        self._exchange = exchange

    async def __aenter__(self) -> Reply:
        try:
            return await self._exchange.__aenter__()
        except (UpstreamError, TimeoutError):  # a deadline keeps its own meaning
            raise
        except Exception as exc:
            raise unsendable(self._upstream, exc) from None

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._exchange.__aexit__(*exc_info)


# ---------------------------------------------------------------- the pool


class SessionFactory(Protocol):
    def __call__(
        self, key: tuple[str, str], capabilities: JSONDict, auth_headers: dict[str, str], owner: SessionOwner
    ) -> LegacyUpstreamSession: ...


def http_sessions(
    upstream: HttpUpstream,
    initialize_timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> SessionFactory:
    def make(
        key: tuple[str, str], capabilities: JSONDict, auth_headers: dict[str, str], owner: SessionOwner
    ) -> LegacyUpstreamSession:
        transport = HttpSessionTransport(upstream)
        return LegacyUpstreamSession(
            transport, key, capabilities, auth_headers, owner, clock, initialize_timeout_s=initialize_timeout_s
        )

    return make


def stdio_sessions(
    make_process: Callable[..., StdioProcess],
    name: str,
    grace_s: float,
    initialize_timeout_s: float,
    handover: ProbeHandover | None = None,
) -> SessionFactory:
    def make(
        key: tuple[str, str], capabilities: JSONDict, auth_headers: dict[str, str], owner: SessionOwner
    ) -> LegacyUpstreamSession:
        transport = StdioSessionTransport(make_process, name, grace_s, handover)
        return LegacyUpstreamSession(
            transport, key, capabilities, auth_headers, owner, initialize_timeout_s=initialize_timeout_s
        )

    return make


def _canonical(value: object) -> str:
    return jsonrpc.canonical(value).decode()


class _CanonicalKeys:
    """The canonical form of a capability set, remembered for the last object seen (requests that
    declare on behalf of every client pass the same one, always)."""

    __slots__ = ("_last", "_last_key")

    def __init__(self) -> None:
        self._last: object = None
        self._last_key = ""

    def __call__(self, capabilities: object) -> str:
        if capabilities is self._last:
            return self._last_key
        key = _canonical(capabilities)
        self._last, self._last_key = capabilities, key
        return key


class SessionPool:
    def __init__(
        self,
        name: str,
        config: PoolConfig,
        owner: SessionOwner,
        factory: SessionFactory,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_change: Callable[[int], None] = lambda delta: None,
    ) -> None:
        """`on_change(delta)`: the number of sessions held changed by `delta` (a gauge)."""
        self._name = name
        self._config = config
        self._owner = owner
        self._clock = clock
        self._factory = factory
        self._canonical = _CanonicalKeys()
        self._sessions: dict[tuple[str, str], list[LegacyUpstreamSession]] = {}
        self._opening: dict[tuple[str, str], asyncio.Future[LegacyUpstreamSession]] = {}
        self._dedicated: set[LegacyUpstreamSession] = set()  # sessions of one user each (listen streams)
        self._on_change = on_change

    def __len__(self) -> int:
        return sum(len(group) for group in self._sessions.values()) + len(self._dedicated)

    async def acquire(
        self,
        principal: str,
        capabilities: JSONDict,
        client_info: JSONDict | None,
        auth_headers: dict[str, str],
        *,
        exclusive: bool,
    ) -> LegacyUpstreamSession:
        key = (principal, self._canonical(capabilities))
        group = self._sessions.get(key)
        if group is None:
            group = self._sessions[key] = []
        session: LegacyUpstreamSession | None = None
        stale = False
        for candidate in group:  # the least busy one this call may share (closed ones go below)
            if candidate.closed:
                stale = True
            elif (not exclusive or candidate.exclusive is None) and (
                session is None or candidate.inflight < session.inflight
            ):
                session = candidate
        if stale:
            group[:] = [s for s in group if not s.closed]
        if session is None:
            pending = self._opening.get(key)
            if pending is not None and not exclusive:
                session = await asyncio.shield(pending)
            else:
                session = await self._open(key, capabilities, client_info, auth_headers, group)
        session.auth_headers = auth_headers  # the caller's latest credentials
        session.inflight += 1
        session.last_used = self._clock()
        return session

    def release(self, session: LegacyUpstreamSession) -> None:
        if session.inflight > 0:
            session.inflight -= 1
        session.last_used = self._clock()

    async def _open(
        self,
        key: tuple[str, str],
        capabilities: JSONDict,
        client_info: JSONDict | None,
        auth_headers: dict[str, str],
        group: list[LegacyUpstreamSession],
    ) -> LegacyUpstreamSession:
        if len(group) >= self._config.max_per_key:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many concurrent interactive calls for this caller")
        if len(self) >= self._config.max_sessions and not await self._evict_one():
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "the proxy holds its maximum of upstream sessions")
        session = self._factory(key, capabilities, auth_headers, self._owner)
        future: asyncio.Future[LegacyUpstreamSession] = asyncio.get_running_loop().create_future()
        self._opening[key] = future
        try:
            await session.open(client_info)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            await session.close()
            raise
        finally:
            self._opening.pop(key, None)
        future.set_result(session)
        self._sessions.setdefault(key, []).append(session)
        self._on_change(1)
        log.info("upstream_session_opened", upstream=self._name, version=session.version)
        return session

    async def open_dedicated(
        self,
        capabilities: JSONDict,
        client_info: JSONDict | None,
        auth_headers: dict[str, str],
        owner: SessionOwner,
        push_wait_s: float,
    ) -> LegacyUpstreamSession:
        """A session for one user only (never shared), counted against `max_sessions`."""
        if len(self) >= self._config.max_sessions and not await self._evict_one():
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "the proxy holds its maximum of upstream sessions")
        session = self._factory(("", ""), capabilities, auth_headers, owner)
        self._dedicated.add(session)
        self._on_change(1)
        try:
            await session.open(client_info, push_wait_s=push_wait_s)
            # Confirms the session; servers that track their sessions from the requests they see
            # (and notify only those) also learn of this one.
            await session.call("ping", timeout_s=10.0)
        except BaseException:
            await self.discard(session)
            raise
        return session

    async def handshake(self) -> None:
        """A legacy `initialize` and its end, on a session of its own that nobody uses (readiness:
        what a new client's session would meet); its errors are `open`'s."""
        session = self._factory(("", ""), {}, {}, self._owner)
        try:
            await session.open(None)
        finally:
            await session.close()

    async def replace(self, session: LegacyUpstreamSession) -> LegacyUpstreamSession:
        """The upstream forgot `session` (HTTP 404): open a fresh one with the same key."""
        await self.discard(session, delete=False)
        fresh = self._factory(session.key, session.capabilities, session.auth_headers, self._owner)
        await fresh.open(None)
        fresh.exclusive, fresh.inflight = session.exclusive, session.inflight
        self._sessions.setdefault(session.key, []).append(fresh)
        self._on_change(1)
        log.info("upstream_session_reinitialized", upstream=self._name)
        return fresh

    async def discard(self, session: LegacyUpstreamSession, *, delete: bool = True) -> None:
        group = self._sessions.get(session.key, [])
        if session in group:
            group.remove(session)
            self._on_change(-1)
        elif session in self._dedicated:
            self._dedicated.discard(session)
            self._on_change(-1)
        await session.close(delete=delete)

    async def _evict_one(self) -> bool:
        idle = [s for g in self._sessions.values() for s in g if s.inflight == 0 and s.exclusive is None]
        if not idle:
            return False
        await self.discard(min(idle, key=lambda s: s.last_used))
        return True

    async def maintain(self) -> None:
        """Close sessions idle too long; ping the others that have been quiet."""
        now = self._clock()
        for session in [s for g in self._sessions.values() for s in g]:
            if session.inflight or session.exclusive is not None:
                continue
            if session.closed or now - session.last_used > self._config.idle_timeout_s:
                await self.discard(session)
            elif now - session.last_used > self._config.ping_interval_s:
                try:
                    await session.call("ping", timeout_s=10.0)
                except (UpstreamError, ProxyError, TimeoutError):
                    await self.discard(session, delete=False)

    async def close_all(self) -> None:
        for session in [s for g in self._sessions.values() for s in g] + list(self._dedicated):
            await self.discard(session)
