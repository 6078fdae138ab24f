"""Sessions the proxy holds with a legacy upstream, and the pool that shares them.

A modern client declares its capabilities per request; a legacy server fixes them per session.
So sessions are keyed by (caller, capabilities) and shared only within a key. An interactive
call (one that may draw server-to-client requests) gets a session to itself while it runs, so
every server request on the session's GET stream can be attributed to exactly one call.
Reference §4.3.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol

import orjson
import structlog

from .. import __version__
from ..config import PoolConfig
from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol import modern_to_legacy as m2l
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from ..protocol.versions import legacy_at_least
from ..upstream.errors import (
    UpstreamError,
    UpstreamProtocolError,
    UpstreamSessionGone,
    UpstreamUnavailable,
)
from ..upstream.http import HttpUpstream, Reply
from ..upstream.stdio import StdioChannel, StdioProcess, StdioReply

JSONDict = dict[str, Any]
log = structlog.get_logger("mcp_era_proxy.upstream")

PROXY_CLIENT_INFO = {"name": "mcp-era-proxy", "version": __version__}
_GET_RETRY_MAX_S = 10.0


class SessionOwner(Protocol):
    """Who handles what a legacy session receives outside a request's own stream."""

    def on_server_request(self, session: UpstreamSession, request: JSONDict) -> None: ...
    def on_notification(self, session: UpstreamSession, note: JSONDict) -> None: ...


class UpstreamSession:
    """One legacy session with the upstream; HTTP by default (see StdioLegacySession for stdio)."""

    def __init__(
        self,
        upstream: HttpUpstream,
        key: tuple[str, str],
        capabilities: JSONDict,
        auth_headers: dict[str, str],
        owner: SessionOwner,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self.name = upstream.name
        self.key = key
        self.capabilities = capabilities  # the modern clientCapabilities this session was opened for
        self.auth_headers = auth_headers
        self.owner = owner
        self._clock = clock
        self.id: str | None = None
        self.version = ""
        self.initialize_result: JSONDict = {}
        self._ids = itertools.count(1)
        self.exclusive: Any = None  # the interactive call that owns this session, if any
        self.inflight = 0
        self.last_used = clock()
        self.log_level: str | None = None
        self.push_channel = False  # the GET stream is open
        self.closed = False
        self.progress_routes: dict[str, Any] = {}  # upstream progress token -> call
        self.active: set[Any] = set()  # calls running on this session
        self._get_task: asyncio.Task[None] | None = None
        self._get_ready: asyncio.Future[bool] | None = None

    # ------------------------------------------------------------ wire

    def headers(self) -> dict[str, str]:
        headers = dict(self.auth_headers)
        if self.id is not None:
            headers[SESSION_HEADER] = self.id
        if self.version and legacy_at_least(self.version, "2025-06-18"):
            headers[PROTOCOL_VERSION_HEADER] = self.version  # the header did not exist before
        return headers

    def next_id(self) -> int:
        return next(self._ids)

    @asynccontextmanager
    async def request(self, message: JSONDict, extra_headers: Mapping[str, str] | None = None) -> AsyncIterator[Reply]:
        self.last_used = self._clock()
        headers = {**self.headers(), **extra_headers} if extra_headers else self.headers()
        async with self.upstream.exchange(message, headers) as reply:
            yield reply

    async def send(self, message: JSONDict) -> None:
        """POST a notification or a response to one of the server's requests."""
        self.last_used = self._clock()
        await self.upstream.send(message, self.headers())

    async def call(self, method: str, params: JSONDict | None = None, timeout_s: float = 30.0) -> JSONDict:
        """A plain request whose reply matters only as a result (ping, setLevel, subscribe)."""
        request_id = self.next_id()
        async with asyncio.timeout(timeout_s), self.request(jsonrpc.request(request_id, method, params)) as reply:
            async for message in reply:
                if "method" in message:
                    self._dispatch(message)
                    continue
                if "error" in message:
                    error = message["error"]
                    raise ProxyError(
                        error.get("code", jsonrpc.INTERNAL_ERROR), str(error.get("message")), data=error.get("data")
                    )
                return message.get("result") or {}
        raise UpstreamProtocolError(self.name, f"sent no reply to {method}")

    # ------------------------------------------------------------ lifecycle

    async def open(self, client_info: JSONDict | None, *, push_wait_s: float = 0.0) -> None:
        """initialize, notifications/initialized, then the GET stream for what the server starts."""
        message = m2l.initialize_request(self.next_id(), self.capabilities, client_info or PROXY_CLIENT_INFO)
        async with asyncio.timeout(30.0), self.upstream.exchange(message, self.auth_headers) as reply:
            self.id = reply.headers.get(SESSION_HEADER)
            result = None
            async for incoming in reply:
                if "method" not in incoming:
                    if "error" in incoming:
                        error = incoming["error"]
                        raise ProxyError(
                            jsonrpc.INTERNAL_ERROR,
                            f"upstream refused initialize: {error.get('message')}",
                            data={"upstreamError": error},
                        )
                    result = incoming.get("result")
                    break
        try:
            self.initialize_result = m2l.check_initialize_result(result)
        except m2l.InitializeRejected as exc:
            raise UpstreamProtocolError(self.name, str(exc)) from None
        self.version = self.initialize_result["protocolVersion"]
        await self.send(jsonrpc.notification("notifications/initialized"))
        await self._start_push(push_wait_s)

    async def _start_push(self, push_wait_s: float) -> None:
        """Open the standalone GET stream that carries what the server starts on its own."""
        loop = asyncio.get_running_loop()
        self._get_ready = loop.create_future()
        self._get_task = asyncio.create_task(self._run_get(), name="upstream-get")
        # Some servers send the GET stream's headers only with its first event, so waiting for
        # the stream to open could take forever: assume it will, unless it is refused quickly.
        self.push_channel = True
        if push_wait_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(push_wait_s):
                    self.push_channel = await asyncio.shield(self._get_ready)

    @property
    def server_capabilities(self) -> JSONDict:
        caps = self.initialize_result.get("capabilities")
        return caps if isinstance(caps, dict) else {}

    @property
    def server_info(self) -> JSONDict | None:
        info = self.initialize_result.get("serverInfo")
        return info if isinstance(info, dict) else None

    async def close(self, *, delete: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        if self._get_task is not None:
            self._get_task.cancel()
            await asyncio.gather(self._get_task, return_exceptions=True)
        if delete and self.id is not None:
            with contextlib.suppress(UpstreamError, TimeoutError):
                async with asyncio.timeout(5.0), self.upstream.exchange(None, self.headers(), method="DELETE") as reply:
                    async for _ in reply:
                        pass

    async def _run_get(self) -> None:
        """Keep the standalone GET stream open; hand what arrives to the owner."""
        backoff = 0.25
        while not self.closed:
            try:
                async with self.upstream.exchange(None, self.headers(), method="GET") as reply:
                    ok = reply.status == 200 and reply.headers.get("Content-Type", "").startswith("text/event-stream")
                    self._ready(ok)
                    if not ok:
                        self.push_channel = False
                        return  # 405: the server offers no push channel
                    backoff = 0.25
                    async for message in reply:
                        self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except UpstreamSessionGone:
                self._ready(False)
                self.closed = True
                return
            except UpstreamError as exc:
                self._ready(False)
                log.debug("upstream_get_lost", upstream=self.upstream.name, error=str(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _GET_RETRY_MAX_S)

    def _ready(self, ok: bool) -> None:
        if self._get_ready is not None and not self._get_ready.done():
            self._get_ready.set_result(ok)

    def _dispatch(self, message: JSONDict) -> None:
        if "method" not in message:
            return
        if "id" in message:
            self.owner.on_server_request(self, message)
        else:
            self.owner.on_notification(self, message)


class SessionFactory(Protocol):
    def __call__(
        self, key: tuple[str, str], capabilities: JSONDict, auth_headers: dict[str, str], owner: SessionOwner
    ) -> UpstreamSession: ...


def _canonical(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class SessionPool:
    def __init__(
        self,
        upstream: HttpUpstream,
        config: PoolConfig,
        owner: SessionOwner,
        clock: Callable[[], float] = time.monotonic,
        session_factory: SessionFactory | None = None,
    ) -> None:
        self._upstream = upstream
        self._config = config
        self._owner = owner
        self._clock = clock
        self._factory: SessionFactory = session_factory or partial(UpstreamSession, upstream, clock=clock)
        self._sessions: dict[tuple[str, str], list[UpstreamSession]] = {}
        self._opening: dict[tuple[str, str], asyncio.Future[UpstreamSession]] = {}
        self._dedicated: set[UpstreamSession] = set()  # sessions of one user each (listen streams)
        self.on_change: Callable[[int], None] = lambda delta: None

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
    ) -> UpstreamSession:
        key = (principal, _canonical(capabilities))
        group = [s for s in self._sessions.get(key, []) if not s.closed]
        self._sessions[key] = group
        free = [s for s in group if not exclusive or s.exclusive is None]
        pending = self._opening.get(key)
        if free:
            session = min(free, key=lambda s: s.inflight)
        elif pending is not None and not exclusive:
            session = await asyncio.shield(pending)
        else:
            session = await self._open(key, capabilities, client_info, auth_headers, group)
        session.auth_headers = auth_headers  # the caller's latest credentials
        session.inflight += 1
        session.last_used = self._clock()
        return session

    def release(self, session: UpstreamSession) -> None:
        session.inflight = max(0, session.inflight - 1)
        session.last_used = self._clock()

    async def _open(
        self,
        key: tuple[str, str],
        capabilities: JSONDict,
        client_info: JSONDict | None,
        auth_headers: dict[str, str],
        group: list[UpstreamSession],
    ) -> UpstreamSession:
        if len(group) >= self._config.max_per_key:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many concurrent interactive calls for this caller")
        if len(self) >= self._config.max_sessions and not await self._evict_one():
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "the proxy holds its maximum of upstream sessions")
        session = self._factory(key, capabilities, auth_headers, self._owner)
        future: asyncio.Future[UpstreamSession] = asyncio.get_running_loop().create_future()
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
        self.on_change(1)
        log.info("upstream_session_opened", upstream=self._upstream.name, version=session.version)
        return session

    async def open_dedicated(
        self,
        capabilities: JSONDict,
        client_info: JSONDict | None,
        auth_headers: dict[str, str],
        owner: SessionOwner,
        push_wait_s: float,
    ) -> UpstreamSession:
        """A session for one user only (never shared), counted against `max_sessions`."""
        if len(self) >= self._config.max_sessions and not await self._evict_one():
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "the proxy holds its maximum of upstream sessions")
        session = self._factory(("", ""), capabilities, auth_headers, owner)
        self._dedicated.add(session)
        self.on_change(1)
        try:
            await session.open(client_info, push_wait_s=push_wait_s)
            # Confirms the session; servers that track their sessions from the requests they see
            # (and notify only those) also learn of this one.
            await session.call("ping", timeout_s=10.0)
        except BaseException:
            await self.discard(session)
            raise
        return session

    async def replace(self, session: UpstreamSession) -> UpstreamSession:
        """The upstream forgot `session` (HTTP 404): open a fresh one with the same key."""
        await self.discard(session, delete=False)
        fresh = self._factory(session.key, session.capabilities, session.auth_headers, self._owner)
        await fresh.open(None)
        fresh.exclusive, fresh.inflight = session.exclusive, session.inflight
        self._sessions.setdefault(session.key, []).append(fresh)
        self.on_change(1)
        log.info("upstream_session_reinitialized", upstream=self._upstream.name)
        return fresh

    async def discard(self, session: UpstreamSession, *, delete: bool = True) -> None:
        group = self._sessions.get(session.key, [])
        if session in group:
            group.remove(session)
            self.on_change(-1)
        elif session in self._dedicated:
            self._dedicated.discard(session)
            self.on_change(-1)
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


class _ChannelUpstream:
    """A stdio channel with the request interface UpstreamSession uses for HTTP."""

    def __init__(self, channel: StdioChannel) -> None:
        self.name = channel.name
        self._channel = channel

    @asynccontextmanager
    async def exchange(self, message: JSONDict, headers: Any = None) -> AsyncIterator[StdioReply]:
        route = self._channel.open_route(message)
        try:
            await self._channel.send(message)
            yield StdioReply(route)
        finally:
            self._channel.close_route(route)

    async def send(self, message: JSONDict, headers: Any = None) -> None:
        await self._channel.send(message)


class StdioLegacySession(UpstreamSession):
    """A legacy stdio server holds one session per process: this session is a process.

    Everything the server sends outside a reply (its requests, notifications) is what the GET
    stream carries over HTTP, and goes the same way: to the owner.
    """

    def __init__(
        self,
        make_process: Callable[..., StdioProcess],
        name: str,
        grace_s: float,
        key: tuple[str, str],
        capabilities: JSONDict,
        auth_headers: dict[str, str],
        owner: SessionOwner,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._grace_s = grace_s
        self.channel = StdioChannel(make_process, name, on_unsolicited=self._dispatch, on_exit=self._exited)
        super().__init__(
            _ChannelUpstream(self.channel),
            key,
            capabilities,
            auth_headers,
            owner,  # type: ignore[arg-type]
            clock,
        )

    def headers(self) -> dict[str, str]:
        return {}  # stdio has no header layer

    async def open(self, client_info: JSONDict | None, *, push_wait_s: float = 0.0) -> None:
        try:
            await self.channel.start()
        except OSError as exc:
            raise UpstreamUnavailable(self.name, f"could not be started: {exc}") from None
        await super().open(client_info, push_wait_s=push_wait_s)

    async def _start_push(self, push_wait_s: float) -> None:
        self.push_channel = True  # the one stdout carries everything

    def _exited(self, code: int | None) -> None:
        self.closed = True

    async def close(self, *, delete: bool = True) -> None:
        self.closed = True
        await self.channel.stop(self._grace_s)
