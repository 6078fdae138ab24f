"""How one legacy upstream session (legacy_session.py) reaches its server: Streamable HTTP (the
session id and version headers on every message, a standalone GET stream for what the server
starts, DELETE at the end) or stdio (the session is a process whose stdout carries everything)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import structlog

from .. import tracing
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from ..protocol.versions import LEGACY_VERSIONS, legacy_at_least
from .base import Reply
from .errors import UpstreamError, UpstreamSessionGone, UpstreamUnavailable
from .http import HttpUpstream
from .stdio import (
    ProbeHandover,
    StdioChannel,
    StdioProcess,
    StdioReply,
    span_transport,
    use_credentials,
    with_headers,
)

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_DELETE_TIMEOUT_S = 5.0
_GET_RETRY_MAX_S = 10.0
# The versions whose messages carry MCP-Protocol-Version (the header did not exist before), found
# once rather than for every message.
_VERSION_HEADER_VERSIONS = frozenset(v for v in LEGACY_VERSIONS if legacy_at_least(v, "2025-06-18"))


class CarriedSession(Protocol):
    """What a transport reads and sets of the session it carries (a LegacyUpstreamSession)."""

    id: str | None  # HTTP: the Mcp-Session-Id the server gave
    version: str  # the negotiated protocol version ("" before initialize)
    auth_headers: dict[str, str]  # the caller's latest credentials
    closed: bool
    push_channel: bool  # what the server starts can reach the proxy

    def dispatch(self, message: JSONDict) -> None:
        """Hand a message the server sent outside a request's reply to the session's owner."""


class SessionTransport(Protocol):
    """How one legacy session reaches its server."""

    @property
    def name(self) -> str: ...

    async def start(self, session: CarriedSession, hello: JSONDict) -> JSONDict | None:
        """Before the session's `initialize` (`hello`; stdio: start the process). The answer to it
        when the server already has it: a process the era probe started and initialized so
        (upstream/stdio.py ProbeHandover); None, the usual: send it."""

    def headers(self, session: CarriedSession) -> dict[str, str]:
        """What every message of the session carries (HTTP: credentials, session id, version)."""

    def exchange(self, message: JSONDict, headers: Mapping[str, str]) -> AbstractAsyncContextManager[Reply]: ...

    async def send(self, message: JSONDict, headers: Mapping[str, str]) -> None:
        """A notification, or a response to one of the server's requests."""

    def adopt(self, session: CarriedSession, reply: Reply) -> None:
        """Learn what the reply to `initialize` says of the session (HTTP: its id)."""

    async def open_push(self, session: CarriedSession, wait_s: float) -> bool:
        """Open what carries the messages the server starts; whether there is such a channel."""

    async def end(self, session: CarriedSession, *, delete: bool) -> None:
        """End the session (HTTP: close the GET stream, DELETE it; stdio: stop the process)."""


class HttpSessionTransport:
    """A legacy session over Streamable HTTP: the session id and version headers on every message,
    a standalone GET stream for what the server starts, DELETE at the end."""

    exchange: Callable[[JSONDict, Mapping[str, str]], AbstractAsyncContextManager[Reply]]

    def __init__(self, upstream: HttpUpstream) -> None:
        self.upstream = upstream
        # The upstream's own exchange, bound once: a method passing the call on would be a Python
        # frame on every request.
        self.exchange = upstream.exchange
        self._get_task: asyncio.Task[None] | None = None
        self._get_ready: asyncio.Future[bool] | None = None

    @property
    def name(self) -> str:
        return self.upstream.name

    async def start(self, session: CarriedSession, hello: JSONDict) -> JSONDict | None:
        return None

    def headers(self, session: CarriedSession) -> dict[str, str]:
        headers = dict(session.auth_headers)
        if session.id is not None:
            headers[SESSION_HEADER] = session.id
        if session.version in _VERSION_HEADER_VERSIONS:
            headers[PROTOCOL_VERSION_HEADER] = session.version
        return headers

    async def send(self, message: JSONDict, headers: Mapping[str, str]) -> None:
        await self.upstream.send(message, headers)

    def adopt(self, session: CarriedSession, reply: Reply) -> None:
        session.id = reply.headers.get(SESSION_HEADER)

    async def open_push(self, session: CarriedSession, wait_s: float) -> bool:
        loop = asyncio.get_running_loop()
        self._get_ready = loop.create_future()
        self._get_task = asyncio.create_task(self._run_get(session), name="upstream-get", context=tracing.background())
        # Some servers send the GET stream's headers only with its first event, so waiting for
        # the stream to open could take forever: assume it will, unless it is refused quickly.
        if wait_s <= 0:
            return True
        try:
            async with asyncio.timeout(wait_s):
                return await asyncio.shield(self._get_ready)
        except TimeoutError:
            return True

    async def _run_get(self, session: CarriedSession) -> None:
        """Keep the standalone GET stream open; hand what arrives to the session's owner."""
        backoff = 0.25
        while not session.closed:
            try:
                async with self.upstream.exchange(None, self.headers(session), method="GET") as reply:
                    ok = reply.status == 200 and reply.headers.get("Content-Type", "").startswith("text/event-stream")
                    self._ready(ok)
                    if not ok:
                        session.push_channel = False
                        return  # 405: the server offers no push channel
                    backoff = 0.25
                    async for message in reply:
                        session.dispatch(message)
            except asyncio.CancelledError:
                raise
            except UpstreamSessionGone:
                self._ready(False)
                session.closed = True
                return
            except UpstreamError as exc:
                self._ready(False)
                log.debug("upstream_get_lost", upstream=self.name, error=str(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _GET_RETRY_MAX_S)

    def _ready(self, ok: bool) -> None:
        if self._get_ready is not None and not self._get_ready.done():
            self._get_ready.set_result(ok)

    async def end(self, session: CarriedSession, *, delete: bool) -> None:
        if self._get_task is not None:
            self._get_task.cancel()
            await asyncio.gather(self._get_task, return_exceptions=True)
        if delete and session.id is not None:
            with contextlib.suppress(UpstreamError, TimeoutError):
                async with (
                    asyncio.timeout(_DELETE_TIMEOUT_S),
                    self.upstream.exchange(None, self.headers(session), method="DELETE") as reply,
                ):
                    async for _ in reply:
                        pass


class StdioSessionTransport:
    """A legacy stdio server holds one session per process: this session is a process. Everything
    it sends outside a reply (its requests, notifications) goes where the GET stream's would."""

    def __init__(
        self,
        make_process: Callable[..., StdioProcess],
        name: str,
        grace_s: float,
        handover: ProbeHandover | None = None,
    ) -> None:
        self._make_process = make_process
        self._name = name
        self._grace_s = grace_s
        self._handover = handover
        self._channel: StdioChannel | None = None
        self._session: CarriedSession | None = None

    @property
    def name(self) -> str:
        return self._name

    def _running(self) -> StdioChannel:
        if self._channel is None:
            raise UpstreamUnavailable(self._name, "has not been started")
        return self._channel

    async def start(self, session: CarriedSession, hello: JSONDict) -> JSONDict | None:
        def exited(code: int | None) -> None:
            session.closed = True

        self._session = session
        probed = self._handover.take_legacy(hello) if self._handover is not None else None
        if probed is not None:  # the era probe's process (initialized with this very `initialize`, if at all)
            channel, answer = probed
            self._channel = channel.rebind(session.dispatch, exited)
            return answer
        make = with_headers(self._make_process, session.auth_headers)  # HTTP+SSE: on the GET and the POSTs
        self._channel = StdioChannel(make, self._name, on_unsolicited=session.dispatch, on_exit=exited)
        await self._channel.start()  # UpstreamUnavailable naming the program if it cannot be started
        return None

    def headers(self, session: CarriedSession) -> dict[str, str]:
        return {}  # stdio has no header layer

    @asynccontextmanager
    async def exchange(self, message: JSONDict, headers: Mapping[str, str]) -> AsyncIterator[Reply]:
        span = tracing.upstream(message, span_transport(self._make_process))
        try:
            if span is not tracing.NULL_UPSTREAM:  # the trace context the server reads is this span's
                message = span.message(message) or message
            channel = self._running()
            route = channel.open_route(message)
            try:
                if self._session is not None:
                    use_credentials(channel, self._session.auth_headers)  # the pool's caller, latest
                await channel.send(message)
                yield StdioReply(route)
            finally:
                channel.close_route(route)
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()

    async def send(self, message: JSONDict, headers: Mapping[str, str]) -> None:
        channel = self._running()
        if self._session is not None:
            use_credentials(channel, self._session.auth_headers)
        await channel.send(message)

    def adopt(self, session: CarriedSession, reply: Reply) -> None:
        pass  # the process is the session: it has no id

    async def open_push(self, session: CarriedSession, wait_s: float) -> bool:
        return True  # the one stdout carries everything

    async def end(self, session: CarriedSession, *, delete: bool) -> None:
        if self._channel is not None:
            await self._channel.stop(self._grace_s)
