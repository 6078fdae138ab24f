"""Modern clients in front of a legacy upstream: the executor of protocol.modern_to_legacy.

Requests run on pooled legacy sessions. When the legacy server asks the client for input in
the middle of a call, the call is parked and the modern client gets `input_required`; its
retry (with `inputResponses` and the signed `requestState`) resumes the very same call.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog

from ..cache import ResponseCache
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import jsonrpc, meta
from ..protocol import modern_to_legacy as m2l
from ..protocol.capabilities import ALL_INPUT_CAPABILITIES, modern_server_capabilities
from ..protocol.detection import names_modern_versions, recognized_modern_error
from ..protocol.modern_validate import ModernRequest, method_problem
from ..protocol.outcome import Outcome
from ..upstream.errors import UpstreamError, UpstreamProtocolError, UpstreamSessionGone
from ..upstream.http import HttpUpstream
from .channel import ReplyChannel
from .legacy_to_modern import upstream_error, upstream_timeout
from .legacy_upstream import SessionFactory, SessionPool, UpstreamSession
from .parking import RequestStateCodec, new_park_id, params_digest
from .tasks import BackgroundTasks

JSONDict = dict[str, Any]
log = structlog.get_logger("mcp_era_proxy.relay")

_STATE_INVALID = "requestState is invalid, expired, already used, or belongs to another request"


class Call:
    """One modern request running on a legacy session; it can be parked between rounds."""

    def __init__(
        self,
        relay: ModernToLegacy,
        session: UpstreamSession,
        request: ModernRequest,
        principal: str,
        interactive: bool,
        upstream_token: str | None,
    ) -> None:
        self.relay = relay
        self.session = session
        self.method = request.method
        self.capabilities = request.capabilities
        self.principal = principal
        self.params = request.message.get("params")  # digested only if the call parks
        self.interactive = interactive
        self.upstream_token = upstream_token
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.pending: dict[str, tuple[JSONDict, JSONDict]] = {}  # key -> (server request, input request)
        self.park_id = new_park_id()
        self.round = 0
        self.upstream_id: int | None = None
        self.finished = False
        self.detached = False  # the client got its answer; the upstream call just runs out
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._trace: dict[str, str] = {}  # this request's trace context (not the session's)

    # ------------------------------------------------------------ upstream side

    def start(self, outgoing: JSONDict, trace: dict[str, str]) -> None:
        self.upstream_id = outgoing["id"]
        self._trace = dict(trace)
        outgoing = meta.carry_trace(outgoing, self._trace)
        self._bind(self.session)
        self._task = asyncio.create_task(self._read(outgoing), name="legacy-call")

    def _bind(self, session: UpstreamSession) -> None:
        self.session = session
        session.active.add(self)
        if self.upstream_token is not None:
            session.progress_routes[self.upstream_token] = self
        if self.interactive:
            session.exclusive = self

    async def _read(self, outgoing: JSONDict) -> None:
        try:
            for attempt in (1, 2):
                try:
                    async with self.session.request(outgoing, self._trace) as reply:
                        async for message in reply:
                            if "method" not in message:
                                if message.get("id") in (self.upstream_id, None):
                                    if self.detached:
                                        self.finish()  # nobody waits for this result any more
                                    else:
                                        self.events.put_nowait(("final", message))
                                    return
                            elif "id" in message:
                                self.on_server_request(message)
                            elif message["method"] == "notifications/cancelled":
                                params = jsonrpc.params_of(message)
                                self.withdraw(params.get("requestId"))
                            else:
                                self.events.put_nowait(("note", message))
                    raise UpstreamProtocolError(
                        self.session.upstream.name, "ended the response stream without a response"
                    )
                except UpstreamSessionGone:
                    if attempt == 2:
                        raise
                    # Not executed: re-initialize and send it again (reference §4.3 Expiry).
                    self._bind(await self.relay.pool.replace(self.session))
                    self.relay.count_reinitialized()
        except asyncio.CancelledError:
            raise
        except (UpstreamError, ProxyError) as exc:
            self.events.put_nowait(("error", exc))

    def on_server_request(self, request: JSONDict) -> None:
        decision = m2l.server_request(request, self.method, self.capabilities)
        if self.detached and not isinstance(decision, m2l.Answer):
            decision = m2l.Answer(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "the client has gone"))
        if isinstance(decision, m2l.Answer):
            self.relay.background(self._reply(request["id"], decision))
            return
        if isinstance(decision, m2l.Missing):
            self.relay.background(self._reply(request["id"], m2l.Answer(error=decision.upstream_error)))
            self.events.put_nowait(("missing", decision.required))
            return
        key = f"s{request['id']}"
        self.pending[key] = (request, decision.input_request)
        self.events.put_nowait(("ask", key))

    def withdraw(self, server_request_id: Any) -> None:
        """The legacy server cancelled one of its own requests."""
        self.pending.pop(f"s{server_request_id}", None)

    async def _reply(self, server_request_id: Any, answer: m2l.Answer) -> None:
        await self.session.send(answer.response(server_request_id))

    async def answer(self, key: str, value: JSONDict) -> None:
        request, _ = self.pending.pop(key)
        await self._reply(request["id"], m2l.Answer(result=value))

    # ------------------------------------------------------------ parking

    def arm(self, timeout_s: float) -> None:
        self.disarm()
        self._expiry = asyncio.get_running_loop().call_later(timeout_s, self.relay.expire, self)

    def disarm(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.disarm()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.session.progress_routes.pop(self.upstream_token or "", None)
        self.session.active.discard(self)
        if self.session.exclusive is self:
            self.session.exclusive = None
        self.relay.pool.release(self.session)
        self.relay.unpark(self)

    async def abandon(self, reason: str) -> None:
        """Give up on the call: answer what it waits for, tell the upstream to stop."""
        if self.finished:
            return
        pending = list(self.pending.values())
        self.pending.clear()
        self.disarm()
        try:
            # Told while its stream is still open, and before the session serves anyone else:
            # some servers mishandle a cancellation for a request whose stream already closed.
            with contextlib.suppress(UpstreamError, ProxyError, TimeoutError):
                async with asyncio.timeout(5.0):
                    for request, _ in pending:
                        await self._reply(request["id"], m2l.abandoned_answer(request["method"]))
                    await self.session.send(
                        jsonrpc.notification(
                            "notifications/cancelled", {"requestId": self.upstream_id, "reason": reason}
                        )
                    )
        finally:
            self.finish()
        log.info("legacy_call_abandoned", upstream=self.session.name, method=self.method, reason=reason)

    def detach(self, timeout_s: float) -> None:
        """The client has its answer; let the upstream finish the call on its own (bounded)."""
        self.detached = True
        self.pending.clear()
        self.arm(timeout_s)


class ModernToLegacy:
    def __init__(
        self,
        settings: Settings,
        upstream: HttpUpstream,
        metrics: Metrics,
        secret: bytes,
        clock: Callable[[], float] = time.time,
        session_factory: SessionFactory | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        self._settings = settings
        self.upstream = upstream
        self._metrics = metrics
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self.pool = SessionPool(upstream, settings.upstream.pool, owner=self, session_factory=session_factory)
        self.pool.on_change = lambda delta: metrics.upstream_sessions.labels(upstream.name).inc(delta)
        self.codec = RequestStateCodec(secret, secrets.token_hex(4), clock)
        self._parked: dict[str, Call] = {}
        self._tasks = BackgroundTasks()
        # Called when an answer says the upstream is not a legacy server (era re-detection).
        self.on_era_mismatch: Callable[[str], None] = lambda reason: None
        self.listens: set[ListenBridge] = set()

    # ------------------------------------------------------------ what sessions receive unasked

    def on_server_request(self, session: UpstreamSession, request: JSONDict) -> None:
        call = session.exclusive
        if isinstance(call, Call) and not call.finished:
            call.on_server_request(request)
            return
        if request.get("method") == "ping":
            answer = m2l.Answer(result={})
        else:
            # No single call to attribute it to (reference §4.5 Attribution).
            answer = m2l.Answer(
                error=jsonrpc.error_object(
                    jsonrpc.INTERNAL_ERROR, "no request in progress can take this server request"
                )
            )
        self.background(session.send(answer.response(request["id"])))

    def on_notification(self, session: UpstreamSession, note: JSONDict) -> None:
        self._cache.invalidate_for(note)
        method = note.get("method")
        params = jsonrpc.params_of(note)
        if method == "notifications/progress":
            call = session.progress_routes.get(params.get("progressToken"))
            if call is not None:
                call.events.put_nowait(("note", note))
        elif method == "notifications/cancelled":
            call = session.exclusive
            if isinstance(call, Call):
                call.withdraw(params.get("requestId"))
        elif method == "notifications/message" and len(session.active) == 1:
            # Without a per-request stream (stdio), a log belongs to the one call running, if one.
            next(iter(session.active)).events.put_nowait(("note", note))
        # Other logs and list changes outside a call's stream have no modern request to go to.

    # ------------------------------------------------------------ requests

    def hint(self, method: str) -> m2l.CacheHint:
        config = self._settings.upstream.cache_methods.get(method, self._settings.upstream.cache)
        return m2l.CacheHint(config.ttl_ms, config.scope)

    async def handle(
        self, request: ModernRequest, channel: ReplyChannel, principal: str, auth_headers: dict[str, str]
    ) -> tuple[JSONDict, int]:
        """Run one validated modern request; returns (reply, HTTP status)."""
        params = request.message.get("params") or {}
        if "requestState" in params:
            return await self._resume(request, channel, principal)
        key = self._cache.key_for(request.method, params, request.version, request.capabilities)
        if key is None:
            return await self._handle(request, channel, principal, auth_headers)

        async def load() -> Outcome:
            reply, status = await self._handle(request, channel, principal, auth_headers)
            return Outcome(reply, status)

        outcome = await self._cache.fetch(key, principal, load)
        return {**outcome.message, "id": request.message["id"]}, outcome.status

    async def _handle(
        self, request: ModernRequest, channel: ReplyChannel, principal: str, auth_headers: dict[str, str]
    ) -> tuple[JSONDict, int]:
        """A new request (not a retry carrying requestState) on a pooled legacy session."""
        front_id = request.message["id"]
        # Trace context belongs to this request; the pooled session keeps only credentials.
        trace = {k: v for k, v in auth_headers.items() if k.lower() in meta.TRACE_KEYS}
        auth_headers = {k: v for k, v in auth_headers.items() if k.lower() not in meta.TRACE_KEYS}
        removed = method_problem(request.method, None)
        if removed is not None:
            return jsonrpc.error_response(front_id, removed.code, removed.message), removed.status
        interactive = request.method in m2l.INPUT_REQUIRED_METHODS and any(
            k in request.capabilities for k in ALL_INPUT_CAPABILITIES
        )
        declared = (
            ALL_INPUT_CAPABILITIES if self._settings.upstream.declare_capabilities == "all" else request.capabilities
        )
        try:
            session = await self.pool.acquire(
                principal, declared, request.client_info, auth_headers, exclusive=interactive
            )
        except UpstreamError as exc:
            raise upstream_error(exc) from None
        except ProxyError as exc:
            upstream = exc.data.get("upstreamError") if isinstance(exc.data, dict) else None
            if names_modern_versions(upstream) or recognized_modern_error(upstream):
                self.on_era_mismatch("initialize refused by a modern server")
            raise
        problem = method_problem(request.method, modern_server_capabilities(session.server_capabilities))
        if problem is not None or request.method == "server/discover":
            self.pool.release(session)
            if problem is not None:
                return jsonrpc.error_response(front_id, problem.code, problem.message), problem.status
            return jsonrpc.result_response(
                front_id, m2l.discover_result(session.initialize_result, self.hint("server/discover"))
            ), 200
        try:
            await self._ensure_level(session, request.log_level)
        except (UpstreamError, ProxyError, TimeoutError) as exc:
            log.warning("upstream_set_level_failed", upstream=self.upstream.name, error=str(exc))
        front_token = m2l.progress_token_of(request.message)
        upstream_id = session.next_id()
        upstream_token = f"p{upstream_id}" if front_token is not None else None
        call = Call(self, session, request, principal, interactive, upstream_token)
        call.start(m2l.to_upstream(request.message, upstream_id, upstream_token), trace)
        return await self._drive(call, channel, front_id, front_token, request.log_level)

    async def _ensure_level(self, session: UpstreamSession, level: str | None) -> None:
        """Make the session at least as verbose as this request asks (reference §4.4)."""
        if level is None or "logging" not in session.server_capabilities:
            return
        if not meta.level_passes(level, session.log_level):
            await session.call("logging/setLevel", {"level": level}, timeout_s=10.0)
            session.log_level = level

    async def _drive(
        self, call: Call, channel: ReplyChannel, front_id: Any, front_token: Any, log_level: str | None
    ) -> tuple[JSONDict, int]:
        """Relay the call to the current front request until it completes or asks for input."""
        parked = False
        try:
            async with asyncio.timeout(self._settings.upstream.request_timeout_s):
                while True:
                    kind, payload = await call.events.get()
                    if kind == "note":
                        await self._relay_note(channel, payload, front_token, log_level)
                    elif kind == "final":
                        call.finish()
                        return self._final(call, front_id, payload)
                    elif kind == "error":
                        call.finish()
                        raise upstream_error(payload) if isinstance(payload, UpstreamError) else payload
                    elif kind == "missing":
                        # The server got an error for its request and may still end the call
                        # by itself; cancel it only if it does not within the request timeout.
                        call.detach(self._settings.upstream.request_timeout_s)
                        return jsonrpc.error_response(
                            front_id,
                            jsonrpc.MISSING_REQUIRED_CAPABILITY,
                            f"the server needs client capabilities this request did not declare: "
                            f"{', '.join(sorted(payload))}",
                            {"requiredCapabilities": payload},
                        ), 400
                    elif payload in call.pending and await self._collect(call, channel, front_token, log_level):
                        parked = True
                        return self._park(call, front_id), 200
        except TimeoutError:
            self.background(call.abandon("timed out"))
            raise upstream_timeout(self.upstream.name) from None
        except BaseException:
            if not parked and not call.finished:
                # The client closed its stream: in 2026-07-28 that is the cancellation.
                self.background(call.abandon("cancelled by the client"))
            raise

    async def _collect(self, call: Call, channel: ReplyChannel, front_token: Any, log_level: str | None) -> bool:
        """After the first input request, give the server a moment to ask the rest.

        True: park now. False: the call ended meanwhile; its outcome is back in the queue.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.input.collect_window_s
        while (remaining := deadline - loop.time()) > 0:
            try:
                async with asyncio.timeout(remaining):
                    kind, payload = await call.events.get()
            except TimeoutError:
                break
            if kind == "note":
                await self._relay_note(channel, payload, front_token, log_level)
            elif kind in ("final", "error", "missing"):
                call.events.put_nowait((kind, payload))  # nothing follows an outcome in the queue
                return False
        return bool(call.pending)

    def _park(self, call: Call, front_id: Any) -> JSONDict:
        if call.park_id not in self._parked and len(self._parked) >= self._settings.input.max_parked:
            self.background(call.abandon("too many parked calls"))
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "the proxy holds its maximum of calls waiting for input")
        self._parked[call.park_id] = call
        self._metrics.parked_calls.set(len(self._parked))
        call.arm(self._settings.input.park_timeout_s)
        self._metrics.input_rounds.labels("modern_to_legacy", method_label(call.method)).inc()
        token = self.codec.mint(
            call.park_id,
            call.principal,
            call.method,
            params_digest(call.params),
            call.round,
            self._settings.input.park_timeout_s,
        )
        result: JSONDict = {
            "resultType": "input_required",
            "inputRequests": {key: entry for key, (_, entry) in call.pending.items()},
            "requestState": token,
        }
        if call.session.server_info is not None:
            result["_meta"] = {meta.SERVER_INFO: call.session.server_info}
        return jsonrpc.result_response(front_id, result)

    def invalidate_for(self, note: JSONDict) -> None:
        self._cache.invalidate_for(note)

    def unpark(self, call: Call) -> None:
        self._parked.pop(call.park_id, None)
        self._metrics.parked_calls.set(len(self._parked))

    def count_reinitialized(self) -> None:
        self._metrics.upstream_reinitialized.labels(self.upstream.name).inc()

    def expire(self, call: Call) -> None:
        self.unpark(call)
        self.background(call.abandon("the client did not retry in time"))

    async def _resume(self, request: ModernRequest, channel: ReplyChannel, principal: str) -> tuple[JSONDict, int]:
        params = request.message.get("params") or {}
        front_id = request.message["id"]
        claims = self.codec.verify(params.get("requestState"))
        call = self._parked.get(claims.park_id) if claims is not None else None
        if (
            claims is None
            or call is None
            or call.finished
            or claims.principal != principal
            or claims.method != request.method
            or claims.digest != params_digest(params)
            or claims.round != call.round
        ):
            return jsonrpc.error_response(front_id, jsonrpc.INVALID_PARAMS, _STATE_INVALID), 400
        responses = params.get("inputResponses", {})
        if not isinstance(responses, dict):
            return jsonrpc.error_response(front_id, jsonrpc.INVALID_PARAMS, "inputResponses must be an object"), 400
        call.round += 1  # this token is spent
        call.disarm()
        self.unpark(call)
        call.capabilities = request.capabilities
        try:
            for key in [k for k in call.pending if isinstance(responses.get(k), dict)]:
                await call.answer(key, responses[key])
        except (UpstreamError, ProxyError) as exc:
            self.background(call.abandon("could not deliver the client's answers"))
            raise upstream_error(exc) if isinstance(exc, UpstreamError) else exc from None
        if call.pending:  # asked again for what is still missing (mrtr.mdx §Error Handling)
            return self._park(call, front_id), 200
        return await self._drive(call, channel, front_id, m2l.progress_token_of(request.message), request.log_level)

    def _final(self, call: Call, front_id: Any, message: JSONDict) -> tuple[JSONDict, int]:
        if "error" in message and isinstance(message["error"], dict):
            error, status = m2l.error_to_downstream(message["error"])
            return {"jsonrpc": "2.0", "id": front_id, "error": error}, status
        result = jsonrpc.obj(message.get("result"))
        hint = self.hint(call.method) if call.method in m2l.CACHEABLE_METHODS else None
        return jsonrpc.result_response(
            front_id, m2l.result_to_downstream(call.method, result, call.session.server_info, hint)
        ), 200

    async def _relay_note(self, channel: ReplyChannel, note: JSONDict, front_token: Any, log_level: str | None) -> None:
        out = m2l.notification_to_downstream(note, front_token, log_level)
        if out is not None and channel.can_stream:
            await channel.send(out)

    # ------------------------------------------------------------ housekeeping

    def background(self, coroutine: Any) -> None:
        self._tasks.spawn(coroutine)

    async def maintain(self) -> None:
        await self.pool.maintain()

    def end_streams(self) -> None:
        """Shutdown begins: every listen stream ends with its completion result."""
        for bridge in list(self.listens):
            bridge.queue.put_nowait(None)

    async def close_all(self) -> None:
        for call in list(self._parked.values()):
            await call.abandon("the proxy is shutting down")
        self.end_streams()
        for bridge in list(self.listens):
            await bridge.close()
        await self._tasks.drain()
        await self.pool.close_all()


class ListenBridge:
    """One modern `subscriptions/listen` stream over a legacy session of its own (reference §4.6).

    The dedicated session's GET stream carries the list changes; `resources/subscribe` adds
    the URIs. Everything relayed is tagged with the subscription id, and only what was asked
    for and acknowledged is relayed.
    """

    def __init__(
        self, relay: ModernToLegacy, request: ModernRequest, principal: str, auth_headers: dict[str, str]
    ) -> None:
        self._relay = relay
        self._request = request
        self._principal = principal
        self._auth_headers = auth_headers
        self.subscription_id = request.message["id"]
        self.queue: asyncio.Queue[JSONDict | None] = asyncio.Queue()
        self.honored: JSONDict = {}
        self._session: UpstreamSession | None = None

    # SessionOwner: what the dedicated session's GET stream brings.
    def on_server_request(self, session: UpstreamSession, request: JSONDict) -> None:
        self._relay.on_server_request(session, request)  # nobody to ask: ping answered, others refused

    def on_notification(self, session: UpstreamSession, note: JSONDict) -> None:
        self._relay.invalidate_for(note)
        out = m2l.listen_notification(note, self.honored, self.subscription_id)
        if out is not None:
            self.queue.put_nowait(out)

    async def open(self) -> JSONDict:
        """Open the upstream side; returns the acknowledgement to send first."""
        params = self._request.message.get("params") or {}
        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "subscriptions/listen needs a notifications filter", refused=True)
        if "taskIds" in wanted:
            raise ProxyError(
                jsonrpc.MISSING_REQUIRED_CAPABILITY,
                "task notifications need the tasks extension",
                refused=True,
                data={"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}},
            )
        uris = wanted.get("resourceSubscriptions", [])
        if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "resourceSubscriptions must be a list of URIs", refused=True)
        try:
            session = await self._relay.pool.open_dedicated(
                self._request.capabilities, self._request.client_info, self._auth_headers, owner=self, push_wait_s=0.25
            )
        except UpstreamError as exc:
            raise upstream_error(exc) from None
        self._session = session
        self._relay.listens.add(self)
        subscribed: list[str] = []
        resources = session.server_capabilities.get("resources")
        if uris and isinstance(resources, dict) and resources.get("subscribe") and session.push_channel:
            for uri in uris:
                try:
                    await session.call("resources/subscribe", {"uri": uri}, timeout_s=10.0)
                    subscribed.append(uri)
                except (UpstreamError, ProxyError, TimeoutError) as exc:
                    log.info("upstream_subscribe_refused", upstream=self._relay.upstream.name, error=str(exc))
        self.honored = m2l.honored_filter(wanted, session.server_capabilities, session.push_channel, subscribed)
        return m2l.acknowledgement(self.honored, self.subscription_id)

    async def close(self) -> None:
        session = self._session
        self._relay.listens.discard(self)
        if session is None or session.closed:
            return
        with contextlib.suppress(UpstreamError, ProxyError, TimeoutError):
            for uri in self.honored.get("resourceSubscriptions", ()):
                await session.call("resources/unsubscribe", {"uri": uri}, timeout_s=5.0)
        await self._relay.pool.discard(session)

    @property
    def alive(self) -> bool:
        return self._session is not None and not self._session.closed


async def probe(relay: ModernToLegacy) -> None:
    """Readiness for a legacy upstream: a pooled session answers ping."""
    session = await relay.pool.acquire("", {}, None, {}, exclusive=False)
    try:
        await session.call("ping", timeout_s=5.0)
    finally:
        relay.pool.release(session)
