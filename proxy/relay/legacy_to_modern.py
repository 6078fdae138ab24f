"""Legacy clients in front of a modern upstream: the executor of protocol.legacy_to_modern.

It holds the legacy sessions (initialize, session ids, ping, setLevel, subscriptions, the GET
stream), turns each request into a stateless modern one, relays request-scoped notifications as
they arrive, and runs multi round-trip requests by asking the client itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import structlog

from .. import __version__
from ..cache import ResponseCache, request_key
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import jsonrpc, meta
from ..protocol import legacy_to_modern as l2m
from ..protocol.capabilities import modern_client_capabilities
from ..protocol.forwarded_call import (
    Action,
    Ask,
    AskClient,
    Fail,
    Finish,
    ForwardedCall,
    InputRound,
    Log,
    LookupToolHeaders,
    RelayToClient,
    Renegotiated,
    SendUpstream,
    SuspectEra,
    WithdrawAsks,
    final_message,
    outcome_message,
)
from ..protocol.headers import ParamHeader
from ..protocol.outcome import Outcome, timed_out
from ..protocol.versions import LATEST_MODERN, pick_modern
from ..sessions import LegacySession, SessionIds, SessionStore, short_hash
from ..upstream.errors import UpstreamError, UpstreamProtocolError
from ..upstream.http import HttpUpstream
from .channel import ReplyChannel
from .failures import UpstreamFailures, to_client_error
from .listen import SessionListener, listen_request
from .runtime import GetStream, SessionRuntime
from .tasks import CancelScope, TaskScope

JSONDict = dict[str, Any]
log = structlog.get_logger("mcp_era_proxy.relay")

PROXY_INFO = {"name": "mcp-era-proxy", "version": __version__}
# Answered by the proxy itself; never forwarded (reference §3.3).
_LOCAL_METHODS = frozenset({"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})
_DROPPED_NOTIFICATIONS = frozenset({"notifications/roots/list_changed", "notifications/progress"})
_TOOLS_REFRESH_S = 5.0


def upstream_error(exc: UpstreamError) -> ProxyError:
    """How an upstream failure reaches the client (not counted: see relay.failures)."""
    return to_client_error(exc.failure)


def upstream_timeout(name: str) -> ProxyError:
    return to_client_error(timed_out(name))


class _ToolHeaders:
    """Per-caller registry of `x-mcp-header` annotations learnt from tools/list."""

    def __init__(self) -> None:
        self.tools: dict[str, tuple[ParamHeader, ...]] = {}
        self.fetched_at: float | None = None


class LegacyToModern:
    def __init__(
        self,
        settings: Settings,
        upstream: HttpUpstream,
        store: SessionStore,
        ids: SessionIds,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        cache: ResponseCache | None = None,
        failures: UpstreamFailures | None = None,
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._failures = failures if failures is not None else UpstreamFailures(metrics)
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self._store = store
        self._ids = ids
        self._metrics = metrics
        self._clock = clock
        self._runtimes: dict[str, SessionRuntime] = {}
        self._upstream_ids = itertools.count(1)
        self._tool_headers: dict[str, _ToolHeaders] = {}
        self._tasks = TaskScope(__name__)
        # Called when an answer says the upstream no longer speaks 2026-07-28 (era re-detection).
        self.on_era_mismatch: Callable[[str], None] = lambda reason: None
        self._modern_version = LATEST_MODERN

    # ------------------------------------------------------------ sessions

    async def initialize(self, message: JSONDict, principal: str, auth_headers: dict[str, str]) -> tuple[JSONDict, str]:
        """Answer `initialize` from the upstream's discover result and mint a session."""
        params = message.get("params")
        if not isinstance(params, dict):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "initialize needs params")
        if await self._store.count() >= self._settings.sessions.max_sessions:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many sessions", status=503, outcome="rejected")
        try:
            discover = await self.discover(principal, auth_headers)
        except UpstreamError as exc:
            raise self._failures.client_error(exc) from None
        try:
            legacy, modern, result = l2m.initialize_result(discover, params.get("protocolVersion"), PROXY_INFO)
        except l2m.InitializeRefused as exc:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, str(exc)) from None
        client_caps = jsonrpc.obj(params.get("capabilities"))
        client_info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else None
        now = self._clock()
        session = LegacySession(
            id=self._ids.mint(principal),
            principal=principal,
            legacy_version=legacy,
            modern_version=modern,
            client_capabilities=client_caps,
            upstream_capabilities=modern_client_capabilities(client_caps, legacy),
            server_capabilities=jsonrpc.obj(discover.get("capabilities")),
            client_info=client_info,
            log_level=self._settings.sessions.default_log_level,
            created_at=now,
            last_seen=now,
        )
        await self._store.add(session)
        self._metrics.sessions_open.labels("legacy").inc()
        log.info(
            "session_opened",
            session=short_hash(session.id),
            legacy_version=legacy,
            modern_version=modern,
            client=(client_info or {}).get("name"),
        )
        return result, session.id

    async def resolve(self, session_id: str, principal: str) -> LegacySession | None:
        """The live session for this id and caller, or None (→ HTTP 404)."""
        if not self._ids.check(session_id, principal):
            return None
        session = await self._store.get(session_id)
        if session is None or session.principal != principal:
            return None
        now = self._clock()
        if now - session.last_seen > self._settings.sessions.idle_timeout_s and not self._busy(session.id):
            await self.close(session.id, reason="expired")
            return None
        session.last_seen = now
        await self._store.save(session)
        return session

    def _busy(self, session_id: str) -> bool:
        runtime = self._runtimes.get(session_id)
        return runtime is not None and runtime.busy

    def _runtime(self, session: LegacySession) -> SessionRuntime:
        runtime = self._runtimes.get(session.id)
        if runtime is None:
            runtime = SessionRuntime(self._settings.sessions.notification_buffer)
            if session.initialized:
                runtime.initialized.set()
            self._runtimes[session.id] = runtime
        return runtime

    async def close(self, session_id: str, *, reason: str) -> bool:
        session = await self._store.remove(session_id)
        runtime = self._runtimes.pop(session_id, None)
        if runtime is not None:
            await runtime.aclose()
        if session is None:
            return False
        self._metrics.sessions_open.labels("legacy").dec()
        if reason == "expired":
            self._metrics.sessions_expired.inc()
        log.info("session_closed", session=short_hash(session_id), reason=reason)
        return True

    async def reap(self) -> int:
        """Close sessions past their lifetime, and idle ones (no open stream, nothing in flight)."""
        now = self._clock()
        closed = 0
        for session_id in await self._store.created_before(now - self._settings.sessions.max_lifetime_s):
            closed += await self.close(session_id, reason="expired")
        for session_id in await self._store.idle_since(now - self._settings.sessions.idle_timeout_s):
            if self._busy(session_id):
                session = await self._store.get(session_id)
                if session is not None:
                    session.last_seen = now
                    await self._store.save(session)
                continue
            closed += await self.close(session_id, reason="expired")
        return closed

    def end_streams(self) -> None:
        """Shutdown begins: end every GET stream; calls in flight may still finish."""
        for runtime in self._runtimes.values():
            runtime.end_streams()

    async def close_all(self) -> None:
        for session_id in list(self._runtimes):
            await self._runtimes.pop(session_id).aclose()

    # ------------------------------------------------------------ messages in a session

    async def handle_notification(self, session: LegacySession, message: JSONDict) -> None:
        method = message["method"]
        if method == "notifications/initialized":
            if not session.initialized:
                session.initialized = True
                await self._store.save(session)
            runtime = self._runtimes.get(session.id)
            if runtime is not None:
                runtime.initialized.set()
        elif method == "notifications/cancelled":
            params = jsonrpc.params_of(message)
            runtime = self._runtimes.get(session.id)
            scope = runtime.inflight.get(params.get("requestId")) if runtime else None
            if scope is not None:
                scope.cancel()
        elif method not in _DROPPED_NOTIFICATIONS:
            log.debug("notification_ignored", method=method, session=short_hash(session.id))

    def handle_response(self, session: LegacySession, message: JSONDict) -> bool:
        """A client's answer to one of our server-to-client requests; False if unexpected."""
        runtime = self._runtimes.get(session.id)
        future = runtime.pending.get(message["id"]) if runtime and isinstance(message["id"], int) else None
        if future is None or future.done():
            return False
        future.set_result(message)
        return True

    async def handle_request(
        self, session: LegacySession, message: JSONDict, channel: ReplyChannel, auth_headers: dict[str, str]
    ) -> JSONDict | None:
        """Run one client request to completion; None when the client cancelled it."""
        runtime = self._runtime(session)
        runtime.auth_headers = auth_headers
        request_id = message["id"]
        if len(runtime.inflight) >= self._settings.sessions.max_inflight_requests:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many concurrent requests in this session")
        if request_id in runtime.inflight:
            raise ProxyError(jsonrpc.INVALID_REQUEST, f"request id {request_id!r} is already in flight")
        async with CancelScope() as scope:
            runtime.inflight[request_id] = scope
            try:
                return await self._dispatch(session, runtime, message, channel, auth_headers)
            finally:
                if runtime.inflight.get(request_id) is scope:
                    del runtime.inflight[request_id]
        return None  # the client cancelled it

    async def _dispatch(
        self,
        session: LegacySession,
        runtime: SessionRuntime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        method = message["method"]
        request_id = message["id"]
        if method in _LOCAL_METHODS:
            return jsonrpc.result_response(request_id, await self._local(session, runtime, message))
        return await self._forward(session, runtime, message, channel, auth_headers)

    async def _local(self, session: LegacySession, runtime: SessionRuntime, message: JSONDict) -> JSONDict:
        method = message["method"]
        params = jsonrpc.params_of(message)
        if method == "ping":
            return {}
        if method == "logging/setLevel":
            level = params.get("level")
            if level not in meta.LOG_LEVELS:
                raise ProxyError(jsonrpc.INVALID_PARAMS, f"unknown log level {level!r}")
            session.log_level = level
            await self._store.save(session)
            return {}
        uri = params.get("uri")
        if not isinstance(uri, str) or not uri:
            raise ProxyError(jsonrpc.INVALID_PARAMS, f"{method} needs a uri")
        if method == "resources/subscribe":
            resources = session.server_capabilities.get("resources")
            if not (isinstance(resources, dict) and resources.get("subscribe")):
                raise ProxyError(jsonrpc.METHOD_NOT_FOUND, "the upstream does not support resource subscriptions")
            session.subscriptions = session.subscriptions | {uri}
            await self._store.save(session)
            try:
                try:
                    ack = await self._listener(session, runtime).refresh()
                except (UpstreamError, TimeoutError) as exc:
                    raise ProxyError(jsonrpc.INTERNAL_ERROR, f"could not subscribe upstream: {exc}") from None
                if uri not in (ack.get("resourceSubscriptions") or ()):
                    raise ProxyError(
                        jsonrpc.INTERNAL_ERROR, f"the upstream did not acknowledge a subscription to {uri}"
                    )
            except ProxyError:
                session.subscriptions = session.subscriptions - {uri}
                await self._store.save(session)
                raise
            return {}
        # resources/unsubscribe: filter locally at once, re-listen in the background.
        session.subscriptions = session.subscriptions - {uri}
        await self._store.save(session)
        if runtime.listener is not None:
            self._background(runtime.listener.refresh())
        return {}

    # ------------------------------------------------------------ forwarding

    def _profile(self, session: LegacySession) -> l2m.ClientProfile:
        return l2m.ClientProfile(
            session.modern_version, session.upstream_capabilities, session.client_info, session.log_level
        )

    async def _forward(
        self,
        session: LegacySession,
        runtime: SessionRuntime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        method = message["method"]
        key = self._cache.key_for(method, message.get("params"), session.modern_version, session.upstream_capabilities)

        async def load() -> Outcome:
            call = self._new_call(session, message, channel.can_stream, auth_headers)
            finish = await self._drive(call, session, runtime, channel, auth_headers)
            return Outcome(outcome_message(finish), shareable=finish.cacheable)

        outcome = await self._cache.fetch(key, session.principal, load) if key is not None else await load()
        reply = outcome.message
        if method == "tools/list" and isinstance(reply.get("result"), dict):
            reply = {**reply, "result": self._learn_tools(session.principal, reply["result"])}
        return final_message(message, reply, session.legacy_version)

    def _new_call(
        self, session: LegacySession, message: JSONDict, can_stream: bool, auth_headers: Mapping[str, str]
    ) -> ForwardedCall:
        return ForwardedCall.new(
            message,
            self._profile(session),
            session.legacy_version,
            tag=str(next(self._upstream_ids)),
            upstream=self._upstream.name,
            can_stream=can_stream,
            max_rounds=self._settings.input.max_rounds,
            trace={k: v for k, v in auth_headers.items() if k in meta.TRACE_KEYS},
        )

    async def _drive(
        self,
        call: ForwardedCall,
        session: LegacySession,
        runtime: SessionRuntime | None,
        channel: ReplyChannel,
        auth_headers: Mapping[str, str],
    ) -> Finish:
        """Execute the call's actions until it finishes; an upstream failure raises its ProxyError."""
        credentials = {k: v for k, v in auth_headers.items() if k not in meta.TRACE_KEYS}
        actions = deque(call.start())
        while actions:
            action = actions.popleft()
            match action:
                case SendUpstream():
                    if action.delay_s:
                        await asyncio.sleep(action.delay_s)
                    actions.extend(await self._exchange(call, action, credentials, channel))
                case LookupToolHeaders(tool=tool, refresh=refresh):
                    if refresh:
                        self._tool_headers.pop(session.principal, None)
                    actions.extend(call.tool_headers(await self._param_headers(session, tool, auth_headers)))
                case AskClient(asks=asks):
                    assert runtime is not None  # only a call that can stream asks, and such a call has a session
                    actions.extend(await self._ask_client(call, session, runtime, channel, asks))
                case RelayToClient(message=note):
                    await channel.send(note)
                case Renegotiated(version=version):
                    self._cache.clear("version_renegotiated")
                    session.modern_version = version
                    await self._store.save(session)
                case SuspectEra(reason=reason):
                    self.on_era_mismatch(reason)
                case InputRound():
                    self._metrics.input_rounds.labels("legacy_to_modern", method_label(call.method)).inc()
                case Log(level=level, event=event, fields=fields):
                    getattr(log, level)(event, upstream=self._upstream.name, **fields)
                case Fail(failure=failure):
                    raise self._failures.client_error(failure)
                case Finish():
                    return action
                case WithdrawAsks():
                    pass  # withdrawn where the asks are awaited (_ask_client)
        raise AssertionError("a forwarded call ended without finishing")  # pragma: no cover

    async def _exchange(
        self, call: ForwardedCall, send: SendUpstream, credentials: Mapping[str, str], channel: ReplyChannel
    ) -> list[Action]:
        """Send one upstream request and feed what comes back to the call; relay its notifications
        as they arrive. Returns the actions that follow the reply."""
        try:
            async with asyncio.timeout(self._settings.upstream.request_timeout_s):
                async with self._upstream.exchange(send.message, {**credentials, **send.headers}) as messages:
                    async for incoming in messages:
                        follow: list[Action] = []
                        for action in call.upstream_message(incoming):
                            if isinstance(action, RelayToClient):
                                await channel.send(action.message)
                            elif isinstance(action, Log):
                                getattr(log, action.level)(action.event, upstream=self._upstream.name, **action.fields)
                            else:
                                follow.append(action)
                        if not call.awaiting_upstream:
                            return follow
        except UpstreamError as exc:
            return call.upstream_failed(exc.failure)
        except TimeoutError:
            return call.upstream_failed(timed_out(self._upstream.name))
        return call.upstream_ended()

    # ------------------------------------------------------------ x-mcp-header

    def _learn_tools(self, principal: str, result: JSONDict) -> JSONDict:
        page = l2m.screen_tools(result)
        for name, reason in page.rejected:
            log.warning("tool_withheld", upstream=self._upstream.name, tool=name, reason=reason)
        registry = self._tool_headers.setdefault(principal, _ToolHeaders())
        for tool in page.result.get("tools") or ():
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                registry.tools[tool["name"]] = page.headers.get(tool["name"], ())
        return page.result

    async def _param_headers(
        self, session: LegacySession, name: str, auth_headers: Mapping[str, str]
    ) -> tuple[ParamHeader, ...]:
        registry = self._tool_headers.get(session.principal)
        if registry is not None and name in registry.tools:
            return registry.tools[name]
        now = time.monotonic()
        if registry is None or registry.fetched_at is None or now - registry.fetched_at > _TOOLS_REFRESH_S:
            await self._fetch_tools(session, auth_headers)
            registry = self._tool_headers.get(session.principal)
        return registry.tools.get(name, ()) if registry else ()

    async def _fetch_tools(self, session: LegacySession, auth_headers: Mapping[str, str]) -> None:
        """Walk every tools/list page so tools/call can mirror annotated arguments."""
        registry = self._tool_headers.setdefault(session.principal, _ToolHeaders())
        registry.fetched_at = time.monotonic()
        cursor: Any = None
        for _ in range(100):
            params: JSONDict = {"cursor": cursor} if cursor is not None else {}
            call = self._new_call(session, jsonrpc.request(0, "tools/list", params), False, auth_headers)
            try:
                finish = await self._drive(call, session, None, _NO_CHANNEL, auth_headers)
            except ProxyError as exc:
                log.warning("tools_prefetch_failed", upstream=self._upstream.name, error=exc.message)
                return
            if finish.result is None:
                return
            self._learn_tools(session.principal, finish.result)
            cursor = finish.result.get("nextCursor")
            if cursor is None:
                return

    # ------------------------------------------------------------ input requests (MRTR)

    async def _ask_client(
        self,
        call: ForwardedCall,
        session: LegacySession,
        runtime: SessionRuntime,
        channel: ReplyChannel,
        asks: tuple[Ask, ...],
    ) -> list[Action]:
        """Put the input requests to the legacy client on this request's stream, each as a
        server-to-client request; feed each answer to the call as it arrives."""
        if len(runtime.pending) + len(asks) > self._settings.sessions.max_pending_inputs:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many unanswered input requests in this session")
        if not runtime.initialized.is_set():
            # Servers must not send requests before notifications/initialized (lifecycle §Initialization).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.input.initialized_wait_s):
                    await runtime.initialized.wait()
        loop = asyncio.get_running_loop()
        waiting: dict[asyncio.Future[JSONDict], tuple[str, int]] = {}  # answer -> (key, server request id)
        actions: list[Action] = []
        try:
            for ask in asks:
                server_id = next(runtime.server_request_ids)
                future: asyncio.Future[JSONDict] = loop.create_future()
                runtime.pending[server_id] = future
                waiting[future] = (ask.key, server_id)
                await channel.send(jsonrpc.request(server_id, ask.method, ask.params))
            deadline = loop.time() + self._settings.input.round_timeout_s
            unanswered = set(waiting)
            while unanswered and not actions:
                # asyncio.wait, unlike gather, leaves the futures alone when this task is cancelled,
                # so the unanswered ones can be withdrawn below.
                answered, unanswered = await asyncio.wait(
                    unanswered, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
                if not answered:
                    actions = call.round_timed_out()
                for future in answered:
                    actions.extend(call.client_answered(waiting[future][0], future.result()))
        except asyncio.CancelledError:
            actions = call.cancelled()
            raise
        finally:
            withdrawn = next((a for a in actions if isinstance(a, WithdrawAsks)), None)
            if withdrawn is not None:
                ids = {key: server_id for key, server_id in waiting.values()}
                await _withdraw(channel, [ids[key] for key in withdrawn.keys if key in ids], withdrawn.reason)
            for _, server_id in waiting.values():
                runtime.pending.pop(server_id, None)
        return actions

    # ------------------------------------------------------------ GET stream and listen

    def open_get_stream(self, session: LegacySession) -> GetStream:
        runtime = self._runtime(session)
        stream = runtime.open_stream(self._settings.sessions.max_get_streams)
        if not runtime.list_changes:
            runtime.list_changes = True
            self._background(self._listener(session, runtime).refresh())
        return stream

    def close_get_stream(self, session_id: str, stream: GetStream) -> None:
        runtime = self._runtimes.get(session_id)
        if runtime is not None:
            runtime.detach(stream)

    def _listener(self, session: LegacySession, runtime: SessionRuntime) -> SessionListener:
        if runtime.listener is None:

            def current_filter() -> JSONDict:
                return l2m.listen_filter(session.server_capabilities, session.subscriptions, runtime.list_changes)

            def deliver(message: JSONDict) -> None:
                self._cache.invalidate_for(message)
                note = l2m.strip_subscription_id(message)
                if note.get("method") == "notifications/resources/updated":
                    params = jsonrpc.params_of(note)
                    if params.get("uri") not in session.subscriptions:
                        return  # unsubscribed meanwhile: filter locally until the re-listen lands
                runtime.deliver(note)

            @asynccontextmanager
            async def open_stream(filter_: JSONDict) -> AsyncIterator[AsyncIterator[JSONDict]]:
                upstream_id = f"listen-{next(self._upstream_ids)}"
                outgoing = listen_request(upstream_id, filter_, l2m.request_meta(self._profile(session)))
                headers = {**runtime.auth_headers, **l2m.upstream_headers(outgoing, session.modern_version)}
                async with self._upstream.exchange(outgoing, headers) as messages:
                    yield messages

            runtime.listener = SessionListener(
                open_stream=open_stream,
                current_filter=current_filter,
                deliver=deliver,
                retry_max_s=self._settings.streams.listen_retry_max_s,
                on_stream_change=lambda d: self._metrics.streams_open.labels("upstream_listen").inc(d),
            )
        return runtime.listener

    def _background(self, coroutine: Any) -> None:
        self._tasks.spawn(coroutine)

    # ------------------------------------------------------------ discover

    async def discover(self, principal: str = "", auth_headers: Mapping[str, str] | None = None) -> JSONDict:
        """The upstream's DiscoverResult, from the cache while fresh (legacy initialize uses it)."""

        async def load() -> Outcome:
            return Outcome({"jsonrpc": "2.0", "result": await self._fetch_discover(auth_headers or {})})

        key = request_key("server/discover", {}, self._modern_version, {})
        result: JSONDict = (await self._cache.fetch(key, principal, load)).message["result"]
        return result

    @property
    def upstream(self) -> Any:
        return self._upstream

    @property
    def modern_version(self) -> str:
        return self._modern_version

    async def probe(self) -> JSONDict:
        """Ask the upstream directly (no cache): used by readiness."""
        return await self._fetch_discover({})

    async def _fetch_discover(self, auth_headers: Mapping[str, str]) -> JSONDict:
        version = self._modern_version
        for _ in range(2):
            outgoing = jsonrpc.request(
                f"discover-{next(self._upstream_ids)}",
                "server/discover",
                {"_meta": l2m.request_meta(l2m.ClientProfile(version, {}, PROXY_INFO))},
            )
            headers = {**auth_headers, **l2m.upstream_headers(outgoing, version)}
            async with asyncio.timeout(self._settings.readiness.probe_timeout_s * 3):
                async with self._upstream.exchange(outgoing, headers) as messages:
                    reply = None
                    async for incoming in messages:
                        if "method" not in incoming:
                            reply = incoming
                            break
            if reply is None:
                raise UpstreamProtocolError(self._upstream.name, "sent no reply to server/discover")
            error = reply.get("error")
            if isinstance(error, dict) and error.get("code") == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION:
                data = jsonrpc.obj(error.get("data"))
                picked = pick_modern(data.get("supported"))
                if picked is None or picked == version:
                    break
                version = self._modern_version = picked
                continue
            result = reply.get("result")
            if isinstance(result, dict) and isinstance(result.get("supportedVersions"), list):
                return result
            raise UpstreamProtocolError(
                self._upstream.name, f"answered server/discover with {str(error or result)[:200]}"
            )
        raise UpstreamProtocolError(self._upstream.name, "supports no protocol version this proxy speaks")


async def _withdraw(channel: ReplyChannel, server_ids: list[int], reason: str) -> None:
    """Tell a legacy client to drop the requests we no longer wait for (cancellation §3.6.8)."""
    for server_id in server_ids:  # the asks went out on this stream, so it can carry the withdrawal
        with contextlib.suppress(ConnectionError, RuntimeError):
            await channel.send(
                jsonrpc.notification("notifications/cancelled", {"requestId": server_id, "reason": reason})
            )


class _NoChannel:
    can_stream = False

    async def send(self, message: JSONDict) -> None:  # pragma: no cover - never called
        return None


_NO_CHANNEL = _NoChannel()
