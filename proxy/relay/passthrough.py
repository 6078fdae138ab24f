"""Same-era pairs over a stdio upstream, where bytes cannot simply be relayed.

Over HTTP, same-era traffic is relayed byte for byte (downstream.http). A stdio server has one
channel for everyone, so messages are relayed one by one instead: unchanged, except for what
sharing the channel requires (unique request ids and progress tokens, mapped back).

- ModernPassThrough: modern clients, modern stdio server (one process for all).
- LegacyFacade: legacy clients, legacy stdio server: each client session is a server process,
  and the proxy serves the legacy Streamable HTTP session (id, GET stream, DELETE) around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from ..cache import ResponseCache
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics
from ..protocol import jsonrpc, meta
from ..protocol.modern_to_legacy import listen_closed
from ..protocol.modern_validate import ModernRequest
from ..protocol.outcome import Outcome
from ..protocol.status import status_of
from ..protocol.versions import LEGACY_VERSIONS, Era
from ..sessions import LegacySession, SessionIds, SessionStore, short_hash
from ..upstream.errors import UpstreamError, UpstreamUnavailable
from ..upstream.stdio import StdioChannel, StdioProcess
from .channel import ReplyChannel
from .legacy_to_modern import upstream_error, upstream_timeout
from .runtime import GetStream, SessionRuntime
from .tasks import TaskScope

JSONDict = dict[str, Any]
log = structlog.get_logger("mcp_era_proxy.relay")


def _with_id(message: JSONDict, request_id: Any) -> JSONDict:
    return {**message, "id": request_id}


def _retag(message: JSONDict, key: str, value: Any) -> JSONDict:
    """Put `value` back under params[key] (progress token) of a notification."""
    params = jsonrpc.params_of(message)
    return {**message, "params": {**params, key: value}}


class ModernPassThrough:
    """Modern clients, modern upstream, message by message: always over stdio; over HTTP only for
    cacheable requests (everything else is relayed byte for byte there)."""

    def __init__(self, settings: Settings, upstream: Any, metrics: Metrics, cache: ResponseCache | None = None) -> None:
        self._settings = settings
        self._upstream = upstream
        self._metrics = metrics
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self._ids = itertools.count(1)
        self._ending = asyncio.Event()  # shutdown: listens end with their completion result

    def _outgoing(self, request: ModernRequest) -> tuple[JSONDict, Any, Any]:
        """The request under a channel-unique id (and progress token); returns it, and the originals."""
        message = request.message
        upstream_id = f"m{next(self._ids)}"
        params = jsonrpc.params_of(message)
        front_token = (meta.meta_of(params) or {}).get("progressToken")
        if front_token is not None:
            params = meta.with_meta(params, "progressToken", f"{upstream_id}-progress")
        return {**message, "id": upstream_id, "params": params}, message["id"], front_token

    def _downstream(self, incoming: JSONDict, front_id: Any, front_token: Any) -> JSONDict:
        if "method" not in incoming:
            return _with_id(incoming, front_id)
        if incoming["method"] == "notifications/progress" and front_token is not None:
            return _retag(incoming, "progressToken", front_token)
        note_meta = meta.meta_of(incoming.get("params"))
        if note_meta is not None and meta.SUBSCRIPTION_ID in note_meta:
            return {**incoming, "params": meta.with_meta(incoming.get("params"), meta.SUBSCRIPTION_ID, front_id)}
        return incoming

    async def handle(
        self,
        request: ModernRequest,
        channel: ReplyChannel,
        headers: Mapping[str, str] | None = None,
        principal: str = "",
    ) -> tuple[JSONDict, int]:
        params = request.message.get("params") or {}
        key = self._cache.key_for(request.method, params, request.version, request.capabilities)
        if key is not None and "requestState" not in params and "inputResponses" not in params:
            outcome = await self._cache.fetch(key, principal, lambda: self._forward(request, channel, headers))
            message = outcome.message
        else:
            message = (await self._forward(request, channel, headers)).message
        reply = {**message, "jsonrpc": "2.0", "id": request.message["id"]}
        return reply, status_of(reply, Era.MODERN)

    async def _forward(
        self, request: ModernRequest, channel: ReplyChannel, headers: Mapping[str, str] | None
    ) -> Outcome:
        outgoing, front_id, front_token = self._outgoing(request)
        headers = dict(headers or {})
        outgoing = meta.carry_trace(outgoing, headers)
        try:
            async with (
                asyncio.timeout(self._settings.upstream.request_timeout_s),
                self._upstream.exchange(outgoing, headers) as reply,
            ):
                async for incoming in reply:
                    out = self._downstream(incoming, front_id, front_token)
                    if "method" not in incoming:
                        return Outcome(out)
                    if channel.can_stream:
                        await channel.send(out)
        except UpstreamError as exc:
            self._metrics.upstream_errors.labels(self._upstream.name, exc.kind).inc()
            raise upstream_error(exc) from None
        except TimeoutError:
            raise upstream_timeout(self._upstream.name) from None
        raise upstream_error(UpstreamUnavailable(self._upstream.name, "ended the request without a reply"))

    async def listen(
        self, request: ModernRequest, send: Callable[[JSONDict], Any], headers: Mapping[str, str] | None = None
    ) -> None:
        """A listen stream: relayed until the client leaves (which cancels it upstream)."""
        outgoing, front_id, _ = self._outgoing(request)
        try:
            async with self._upstream.exchange(outgoing, headers or {}) as reply:
                async for incoming in _until(reply, self._ending):
                    if incoming is None:  # the proxy is shutting down: end it gracefully
                        await send(listen_closed(front_id))
                        return
                    self._cache.invalidate_for(incoming)
                    out = self._downstream(incoming, front_id, None)
                    if "method" not in incoming and isinstance(out.get("result"), dict):
                        out = {**out, "result": meta.with_meta(out["result"], meta.SUBSCRIPTION_ID, front_id)}
                    await send(out)
                    if "method" not in incoming:
                        return
        except UpstreamError as exc:
            self._metrics.upstream_errors.labels(self._upstream.name, exc.kind).inc()
            raise upstream_error(exc) from None

    def end_streams(self) -> None:
        self._ending.set()


async def _until(messages: Any, ending: asyncio.Event) -> Any:
    """The messages of `messages`, then None as soon as `ending` is set."""
    iterator = aiter(messages)
    stop = asyncio.ensure_future(ending.wait())
    following: asyncio.Future[Any] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({following, stop}, return_when=asyncio.FIRST_COMPLETED)
            if following not in done:
                yield None
                return
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        stop.cancel()
        if following is not None and not following.done():
            following.cancel()


class _FacadeSession:
    """The live side of one legacy client session over its own server process."""

    def __init__(
        self, facade: LegacyFacade, make_process: Callable[..., StdioProcess], name: str, backlog: int
    ) -> None:
        self.facade = facade
        self.session_id: str | None = None  # known once initialize succeeded
        self.channel = StdioChannel(make_process, name, on_unsolicited=self._unsolicited, on_exit=self._exited)
        self.runtime = SessionRuntime(backlog)
        self.requests: dict[Any, ReplyChannel] = {}  # client request id -> its reply stream

    def _unsolicited(self, message: JSONDict) -> None:
        if self.session_id is not None:
            self.facade.unsolicited(self.session_id, message)

    def _exited(self, code: int | None) -> None:
        if self.session_id is not None:
            self.facade.spawn(self.facade.close(self.session_id, reason="exited"))


class LegacyFacade:
    """Legacy clients over a legacy stdio server: the session interface of LegacyToModern."""

    def __init__(
        self,
        settings: Settings,
        make_process: Callable[..., StdioProcess],
        name: str,
        store: SessionStore,
        ids: SessionIds,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._make_process = make_process
        self._name = name
        self._store = store
        self._ids = ids
        self._metrics = metrics
        self._clock = clock
        self._live: dict[str, _FacadeSession] = {}
        self._tasks = TaskScope(__name__)

    # ------------------------------------------------------------ sessions

    async def initialize(self, message: JSONDict, principal: str, auth_headers: dict[str, str]) -> tuple[JSONDict, str]:
        if await self._store.count() >= self._settings.sessions.max_sessions:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many sessions", status=503, outcome="rejected")
        live = _FacadeSession(self, self._make_process, self._name, self._settings.sessions.notification_buffer)
        try:
            await live.channel.start()
        except OSError as exc:
            raise upstream_error(UpstreamUnavailable(self._name, f"could not be started: {exc}")) from None
        try:
            async with asyncio.timeout(30.0):
                reply = await self._exchange(live, message, None)
        except (UpstreamError, TimeoutError) as exc:
            await live.channel.stop(self._settings.upstream.shutdown_grace_s)
            raise upstream_error(exc) if isinstance(exc, UpstreamError) else upstream_timeout(self._name) from None
        result = reply.get("result")
        if not isinstance(result, dict) or result.get("protocolVersion") not in LEGACY_VERSIONS:
            await live.channel.stop(self._settings.upstream.shutdown_grace_s)
            error = jsonrpc.obj(reply.get("error"))
            raise ProxyError(
                error.get("code", jsonrpc.INTERNAL_ERROR),
                str(error.get("message", "the upstream refused initialize")),
                data=error.get("data"),
            )
        now = self._clock()
        session = LegacySession(
            id=self._ids.mint(principal),
            principal=principal,
            legacy_version=result["protocolVersion"],
            modern_version="",
            client_capabilities=message.get("params", {}).get("capabilities") or {},
            upstream_capabilities={},
            server_capabilities=result.get("capabilities") or {},
            client_info=message.get("params", {}).get("clientInfo"),
            created_at=now,
            last_seen=now,
        )
        await self._store.add(session)
        self._live[session.id] = live
        live.session_id = session.id
        self._metrics.sessions_open.labels("legacy").inc()
        log.info(
            "session_opened",
            session=short_hash(session.id),
            legacy_version=session.legacy_version,
            upstream_process=live.channel.process.pid,
        )
        return result, session.id

    async def resolve(self, session_id: str, principal: str) -> LegacySession | None:
        if not self._ids.check(session_id, principal):
            return None
        session = await self._store.get(session_id)
        if session is None or session.principal != principal or session_id not in self._live:
            return None
        session.last_seen = self._clock()
        await self._store.save(session)
        return session

    async def close(self, session_id: str, *, reason: str) -> bool:
        session = await self._store.remove(session_id)
        live = self._live.pop(session_id, None)
        if live is not None:
            live.runtime.close()
            await live.channel.stop(self._settings.upstream.shutdown_grace_s)
        if session is None:
            return False
        self._metrics.sessions_open.labels("legacy").dec()
        log.info("session_closed", session=short_hash(session_id), reason=reason)
        return True

    async def reap(self) -> int:
        now = self._clock()
        closed = 0
        cutoff = now - self._settings.sessions.idle_timeout_s
        for session_id in await self._store.idle_since(cutoff):
            live = self._live.get(session_id)
            if live is not None and (live.runtime.busy or live.requests):
                continue
            closed += await self.close(session_id, reason="expired")
        for session_id in await self._store.created_before(now - self._settings.sessions.max_lifetime_s):
            closed += await self.close(session_id, reason="expired")
        return closed

    def end_streams(self) -> None:
        for live in self._live.values():
            live.runtime.end_streams()

    async def close_all(self) -> None:
        for session_id in list(self._live):
            await self.close(session_id, reason="shutdown")

    # ------------------------------------------------------------ messages

    async def _exchange(self, live: _FacadeSession, message: JSONDict, channel: ReplyChannel | None) -> JSONDict:
        route = live.channel.open_route(message)
        try:
            await live.channel.send(message)
            async for incoming in route.messages():
                if "method" not in incoming:
                    return incoming
                if channel is not None and channel.can_stream:
                    await channel.send(incoming)  # progress for this request
        finally:
            live.channel.close_route(route)
        raise UpstreamUnavailable(self._name, "ended the request without a reply")

    async def handle_request(
        self, session: LegacySession, message: JSONDict, channel: ReplyChannel, auth_headers: dict[str, str]
    ) -> JSONDict | None:
        live = self._live.get(session.id)
        if live is None:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, "the session's server process is gone")
        live.requests[message["id"]] = channel
        try:
            async with asyncio.timeout(self._settings.upstream.request_timeout_s):
                return await self._exchange(live, message, channel)
        except UpstreamError as exc:
            raise upstream_error(exc) from None
        except TimeoutError:
            raise upstream_timeout(self._name) from None
        finally:
            live.requests.pop(message["id"], None)

    async def handle_notification(self, session: LegacySession, message: JSONDict) -> None:
        await self._write(session, message)

    def handle_response(self, session: LegacySession, message: JSONDict) -> bool:
        self.spawn(self._write(session, message))
        return session.id in self._live

    async def _write(self, session: LegacySession, message: JSONDict) -> None:
        live = self._live.get(session.id)
        if live is not None:
            with contextlib.suppress(ConnectionError):
                await live.channel.write(message)

    def unsolicited(self, session_id: str, message: JSONDict) -> None:
        """What the server sends outside a reply: on the one open request's stream, else GET."""
        live = self._live.get(session_id)
        if live is None:
            return
        if len(live.requests) == 1:
            channel = next(iter(live.requests.values()))
            if channel.can_stream:
                self.spawn(channel.send(message))
                return
        live.runtime.deliver(message)

    def open_get_stream(self, session: LegacySession) -> GetStream:
        live = self._live.get(session.id)
        if live is None:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, "the session's server process is gone")
        return live.runtime.open_stream(self._settings.sessions.max_get_streams)

    def close_get_stream(self, session_id: str, stream: GetStream) -> None:
        live = self._live.get(session_id)
        if live is not None:
            live.runtime.detach(stream)

    def spawn(self, coroutine: Any) -> None:
        self._tasks.spawn(coroutine)
