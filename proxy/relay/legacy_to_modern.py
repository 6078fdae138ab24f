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
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import structlog

from .. import __version__
from ..cache import NO_STORE, ResponseCache, request_key
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import jsonrpc, meta
from ..protocol import legacy_to_modern as l2m
from ..protocol.capabilities import modern_client_capabilities
from ..protocol.detection import recognized_modern_error
from ..protocol.headers import ParamHeader
from ..protocol.versions import LATEST_MODERN, pick_modern
from ..sessions import LegacySession, SessionIds, SessionStore, short_hash
from ..upstream.errors import UpstreamError, UpstreamHTTPError, UpstreamProtocolError
from ..upstream.http import HttpUpstream
from .channel import ReplyChannel
from .listen import SessionListener, listen_request
from .runtime import GetStream, SessionRuntime
from .tasks import BackgroundTasks

JSONDict = dict[str, Any]
log = structlog.get_logger("mcp_era_proxy.relay")

PROXY_INFO = {"name": "mcp-era-proxy", "version": __version__}
# Answered by the proxy itself; never forwarded (reference §3.3).
_LOCAL_METHODS = frozenset({"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})
_DROPPED_NOTIFICATIONS = frozenset({"notifications/roots/list_changed", "notifications/progress"})
_TOOLS_REFRESH_S = 5.0


def upstream_error(exc: UpstreamError) -> ProxyError:
    """How an upstream failure reaches the client; 401/403 are relayed as they came."""
    if isinstance(exc, UpstreamHTTPError) and exc.is_auth:
        headers = {"WWW-Authenticate": exc.www_authenticate} if exc.www_authenticate else {}
        return ProxyError(
            jsonrpc.INVALID_REQUEST,
            f"upstream refused the credentials (HTTP {exc.status})",
            status=exc.status,
            headers=headers,
            outcome="upstream_error",
        )
    return ProxyError(exc.code, exc.client_message, outcome="upstream_error")


def upstream_timeout(name: str) -> ProxyError:
    return ProxyError(jsonrpc.UPSTREAM_TIMEOUT, f"upstream {name!r} timed out", outcome="upstream_error")


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
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self._store = store
        self._ids = ids
        self._metrics = metrics
        self._clock = clock
        self._runtimes: dict[str, SessionRuntime] = {}
        self._upstream_ids = itertools.count(1)
        self._tool_headers: dict[str, _ToolHeaders] = {}
        self._tasks = BackgroundTasks()
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
            raise upstream_error(exc) from None
        try:
            legacy, modern, result = l2m.initialize_result(discover, params.get("protocolVersion"), PROXY_INFO)
        except l2m.InitializeRefused as exc:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, str(exc)) from None
        client_caps = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
        client_info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else None
        now = self._clock()
        session = LegacySession(
            id=self._ids.mint(principal),
            principal=principal,
            legacy_version=legacy,
            modern_version=modern,
            client_capabilities=client_caps,
            upstream_capabilities=modern_client_capabilities(client_caps, legacy),
            server_capabilities=discover.get("capabilities") if isinstance(discover.get("capabilities"), dict) else {},
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
            params = message.get("params") if isinstance(message.get("params"), dict) else {}
            runtime = self._runtimes.get(session.id)
            task = runtime.inflight.get(params.get("requestId")) if runtime else None
            if task is not None:
                task.cancel()
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
        task = asyncio.create_task(self._dispatch(session, runtime, message, channel, auth_headers))
        runtime.inflight[request_id] = task
        try:
            await asyncio.wait({task})
        finally:
            if runtime.inflight.get(request_id) is task:
                del runtime.inflight[request_id]
            if not task.done():
                task.cancel()  # the client went away
        if task.cancelled():
            return None
        return task.result()

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
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
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

        async def load() -> JSONDict:
            return await self._forward_modern(session, runtime, message, channel, auth_headers)

        key = self._cache.key_for(method, message.get("params"), session.modern_version, session.upstream_capabilities)
        if key is not None:
            final = await self._cache.fetch(key, session.principal, load)
        else:
            final = await load()
        if "error" in final:
            return {"jsonrpc": "2.0", "id": message["id"], "error": final["error"]}
        result = final["result"]
        if method == "tools/list":
            result = self._learn_tools(session.principal, result)
        return jsonrpc.result_response(message["id"], l2m.result_to_downstream(method, result, session.legacy_version))

    async def _forward_modern(
        self,
        session: LegacySession,
        runtime: SessionRuntime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        """Run the request upstream, input rounds included: {"result": the complete modern result}
        or {"error": the error as the legacy client must see it}."""
        method = message["method"]
        input_responses: JSONDict | None = None
        request_state: str | None = None
        progress_floor: list[float] = []  # last progress value sent to the client, across rounds
        retried: set[int] = set()
        rounds = 0
        while True:
            param_headers = await self._param_headers(session, message, auth_headers)
            upstream_id = next(self._upstream_ids)
            outgoing = l2m.to_upstream(
                message,
                upstream_id,
                self._profile(session),
                input_responses=input_responses,
                request_state=request_state,
            )
            headers = {**auth_headers, **l2m.upstream_headers(outgoing, session.modern_version, param_headers)}
            outgoing = meta.carry_trace(outgoing, headers)
            try:
                final = await self._exchange(session, outgoing, headers, channel, progress_floor)
            except UpstreamError as exc:
                self._metrics.upstream_errors.labels(self._upstream.name, exc.kind).inc()
                log.warning("upstream_failed", upstream=self._upstream.name, method=method, error=str(exc))
                if isinstance(exc, UpstreamHTTPError) and exc.status in (400, 404, 405):
                    self.on_era_mismatch(f"HTTP {exc.status} without a modern error body")
                raise upstream_error(exc) from None
            except TimeoutError:
                self._metrics.upstream_errors.labels(self._upstream.name, "timeout").inc()
                log.warning("upstream_failed", upstream=self._upstream.name, method=method, error="timeout")
                raise upstream_timeout(self._upstream.name) from None
            if "error" in final:
                error = final["error"]
                code = error.get("code")
                if final.get("id") is None and not recognized_modern_error(error):
                    # A reply that could not even read our request: not a 2026-07-28 server (any more).
                    self.on_era_mismatch(f"error {code} without an id")
                if code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION and code not in retried:
                    retried.add(code)
                    await self._renegotiate(session, error)
                    continue
                if code == jsonrpc.HEADER_MISMATCH and method == "tools/call" and code not in retried:
                    retried.add(code)
                    self._tool_headers.pop(session.principal, None)
                    continue
                if code in (jsonrpc.HEADER_MISMATCH, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION):
                    log.error("upstream_rejected_translation", upstream=self._upstream.name, method=method, error=error)
                    return _error(
                        jsonrpc.INTERNAL_ERROR, f"upstream rejected the translated request: {error.get('message')}"
                    )
                # Keep every field of the upstream error; only the code may change.
                return {"error": l2m.error_to_downstream(method, error)}
            outcome = l2m.classify_result(method, final.get("result"))
            if isinstance(outcome, l2m.Complete):
                # A result that took this client's answers is its own: never cached nor shared.
                return {"result": outcome.result, **({NO_STORE: True} if rounds else {})}
            if isinstance(outcome, l2m.Invalid):
                log.error("upstream_invalid_result", upstream=self._upstream.name, method=method, reason=outcome.reason)
                return _error(
                    jsonrpc.INTERNAL_ERROR, f"upstream {self._upstream.name!r} sent an invalid result: {outcome.reason}"
                )
            rounds += 1
            self._metrics.input_rounds.labels("legacy_to_modern", method_label(method)).inc()
            if rounds > self._settings.input.max_rounds:
                return _error(
                    jsonrpc.INTERNAL_ERROR, f"gave up after {self._settings.input.max_rounds} rounds of input requests"
                )
            if not outcome.input_requests:
                await asyncio.sleep(min(0.05 * rounds, 1.0))  # load shedding: retry with the state only
                input_responses, request_state = None, outcome.request_state
                continue
            input_responses = await self._ask_client(session, runtime, channel, outcome.input_requests)
            request_state = outcome.request_state

    async def _exchange(
        self,
        session: LegacySession,
        outgoing: JSONDict,
        headers: dict[str, str],
        channel: ReplyChannel,
        progress_floor: list[float],
    ) -> JSONDict:
        """Send one upstream request; relay its notifications; return its final response."""
        async with asyncio.timeout(self._upstream_timeout):
            async with self._upstream.exchange(outgoing, headers) as messages:
                async for incoming in messages:
                    if "method" not in incoming:
                        if incoming.get("id") in (outgoing["id"], None):
                            return incoming
                        continue
                    if "id" in incoming:
                        # 2026-07-28 forbids server requests on a response stream.
                        log.warning(
                            "upstream_request_dropped", upstream=self._upstream.name, method=incoming.get("method")
                        )
                        continue
                    if not channel.can_stream:
                        continue  # nowhere to relay it: not worth translating
                    note = l2m.notification_to_downstream(incoming, session.legacy_version, session.log_level)
                    if note is None:
                        continue
                    if note.get("method") == "notifications/progress" and not _progress_increases(note, progress_floor):
                        continue
                    await channel.send(note)
        raise UpstreamProtocolError(self._upstream.name, "ended the response stream without a response")

    @property
    def _upstream_timeout(self) -> float:
        return self._settings.upstream.request_timeout_s

    async def _renegotiate(self, session: LegacySession, error: JSONDict) -> None:
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        version = pick_modern(data.get("supported"))
        if version is None:
            raise ProxyError(
                jsonrpc.INTERNAL_ERROR, f"upstream supports none of our protocol versions: {data.get('supported')!r}"
            )
        self._cache.clear("version_renegotiated")
        session.modern_version = version
        await self._store.save(session)

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
        self, session: LegacySession, message: JSONDict, auth_headers: dict[str, str]
    ) -> tuple[ParamHeader, ...]:
        if message["method"] != "tools/call":
            return ()
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        name = params.get("name")
        registry = self._tool_headers.get(session.principal)
        if registry is not None and name in registry.tools:
            return registry.tools[name]
        now = time.monotonic()
        if registry is None or registry.fetched_at is None or now - registry.fetched_at > _TOOLS_REFRESH_S:
            await self._fetch_tools(session, auth_headers)
            registry = self._tool_headers.get(session.principal)
        return registry.tools.get(name, ()) if registry else ()

    async def _fetch_tools(self, session: LegacySession, auth_headers: dict[str, str]) -> None:
        """Walk every tools/list page so tools/call can mirror annotated arguments."""
        registry = self._tool_headers.setdefault(session.principal, _ToolHeaders())
        registry.fetched_at = time.monotonic()
        cursor: Any = None
        for _ in range(100):
            params: JSONDict = {"cursor": cursor} if cursor is not None else {}
            outgoing = l2m.to_upstream(
                jsonrpc.request(0, "tools/list", params), next(self._upstream_ids), self._profile(session)
            )
            headers = {**auth_headers, **l2m.upstream_headers(outgoing, session.modern_version)}
            try:
                reply = await self._exchange(session, outgoing, headers, _NO_CHANNEL, [])
            except (UpstreamError, TimeoutError) as exc:
                log.warning("tools_prefetch_failed", upstream=self._upstream.name, error=str(exc))
                return
            result = reply.get("result")
            if not isinstance(result, dict):
                return
            self._learn_tools(session.principal, result)
            cursor = result.get("nextCursor")
            if cursor is None:
                return

    # ------------------------------------------------------------ input requests (MRTR)

    async def _ask_client(
        self, session: LegacySession, runtime: SessionRuntime, channel: ReplyChannel, input_requests: JSONDict
    ) -> JSONDict:
        """Put each input request to the legacy client on this request's stream; collect answers."""
        asks: list[tuple[str, str, JSONDict]] = []
        for key, request in input_requests.items():
            try:
                method, params = l2m.input_request_to_downstream(
                    request, session.legacy_version, session.upstream_capabilities
                )
            except l2m.InputRequestRejected as exc:
                log.error("upstream_input_request_rejected", upstream=self._upstream.name, reason=str(exc))
                raise ProxyError(
                    jsonrpc.INTERNAL_ERROR, f"upstream asked for input the client cannot give: {exc}"
                ) from None
            if method == "elicitation/create" and params.get("mode") == "url":
                params = {
                    **params,
                    "elicitationId": f"{short_hash(session.id)}-{key}-{next(runtime.server_request_ids)}",
                }
            asks.append((key, method, params))
        if not channel.can_stream:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, "the upstream needs input but the client does not accept SSE")
        if len(runtime.pending) + len(asks) > self._settings.sessions.max_pending_inputs:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many unanswered input requests in this session")
        if not runtime.initialized.is_set():
            # Servers must not send requests before notifications/initialized (lifecycle §Initialization).
            try:
                async with asyncio.timeout(self._settings.input.initialized_wait_s):
                    await runtime.initialized.wait()
            except TimeoutError:
                pass
        loop = asyncio.get_running_loop()
        waiting: list[tuple[str, str, int, asyncio.Future[JSONDict]]] = []
        try:
            for key, method, params in asks:
                server_id = next(runtime.server_request_ids)
                future: asyncio.Future[JSONDict] = loop.create_future()
                runtime.pending[server_id] = future
                waiting.append((key, method, server_id, future))
                await channel.send(jsonrpc.request(server_id, method, params))
            # asyncio.wait, unlike gather, leaves the futures alone when this task is cancelled,
            # so the unanswered ones can be withdrawn below.
            _, unanswered = await asyncio.wait([f for *_, f in waiting], timeout=self._settings.input.round_timeout_s)
            if unanswered:
                await _withdraw(channel, waiting, "the client did not answer in time")
                raise ProxyError(jsonrpc.INTERNAL_ERROR, "the client did not answer the input requests in time")
        except asyncio.CancelledError:
            await _withdraw(channel, waiting, "request cancelled")
            raise
        finally:
            for _, _, server_id, _ in waiting:
                runtime.pending.pop(server_id, None)
        answers: JSONDict = {}
        for key, method, _, future in waiting:
            reply = future.result()
            value = l2m.input_response_from_downstream(input_requests[key], reply, session.legacy_version)
            if value is None:
                error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
                raise ProxyError(
                    error.get("code", jsonrpc.INTERNAL_ERROR),
                    f"client failed {method}: {error.get('message', 'no result')}",
                    data=error.get("data"),
                )
            answers[key] = value
        return answers

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
                    params = note.get("params") if isinstance(note.get("params"), dict) else {}
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

        async def load() -> JSONDict:
            return {"result": await self._fetch_discover(auth_headers or {})}

        key = request_key("server/discover", {}, self._modern_version, {})
        return (await self._cache.fetch(key, principal, load))["result"]

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
                data = error.get("data") if isinstance(error.get("data"), dict) else {}
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


async def _withdraw(
    channel: ReplyChannel, waiting: list[tuple[str, str, int, asyncio.Future[JSONDict]]], reason: str
) -> None:
    """Tell a legacy client to drop the requests we no longer wait for (cancellation §3.6.8)."""
    for _, _, server_id, future in waiting:
        if not future.done():  # the asks went out on this stream, so it can carry the withdrawal
            with contextlib.suppress(ConnectionError, RuntimeError):
                await channel.send(
                    jsonrpc.notification("notifications/cancelled", {"requestId": server_id, "reason": reason})
                )


def _error(code: int, message: str) -> JSONDict:
    return {"error": jsonrpc.error_object(code, message)}


class _NoChannel:
    can_stream = False

    async def send(self, message: JSONDict) -> None:  # pragma: no cover - never called
        return None


_NO_CHANNEL = _NoChannel()


def _progress_increases(note: JSONDict, floor: list[float]) -> bool:
    """Legacy clients must see progress only increase, across MRTR rounds too."""
    params = note.get("params")
    value = params.get("progress") if isinstance(params, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    if floor and value <= floor[0]:
        return False
    floor[:] = [value]
    return True
