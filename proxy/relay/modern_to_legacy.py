"""Modern clients in downstream of a legacy upstream: the driver of protocol.parked_call.

Requests run on pooled legacy sessions. Each is a ParkedCall machine; this module executes its
actions: it reads the upstream reply, answers the server's requests, relays notifications, keeps
a call parked between a modern client's rounds and resumes it on the retry.

A call that cannot park (no input capability, or a method that takes no input) is read in the
request's own handler; one that can gets a reader task of its own, owned by the call, because
its upstream stream outlives the handler while it is parked.

The call itself is relay/legacy_call.py; the tasks extension for these clients, asked once per
request, is relay/tasks/modern_clients.py; a subscriptions/listen stream is relay/listen_bridge.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

import structlog

from .. import tracing
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import jsonrpc, meta
from ..protocol import modern_tasks as mt
from ..protocol import modern_to_legacy as m2l
from ..protocol.capabilities import ALL_INPUT_CAPABILITIES, carried_extensions
from ..protocol.detection import MODERN_REFUSAL, refused_as_modern
from ..protocol.methods import HINTED_METHODS, INPUT_REQUIRED_METHODS
from ..protocol.modern_validate import ModernRequest, method_problem, unbacked_method
from ..protocol.outcome import Outcome, timed_out
from ..protocol.parked_call import (
    DeliverAnswers,
    DownstreamRequest,
    Fail,
    Park,
    ParkedCall,
    RelayToClient,
    ReplyClient,
    input_required_result,
    invalid_state,
)
from ..protocol.request_state import ParkIds, RequestStateCodec
from ..state.cache import ResponseCache
from ..upstream.errors import UpstreamError
from ..upstream.legacy_session import LegacyUpstreamSession, SessionFactory, SessionPool
from .channel import NO_STREAM, Caller, ReplyChannel
from .detect import Handshakes
from .failures import UpstreamFailures, deliver_notification
from .legacy_call import Exchange, LegacyCall, call_of_notification, call_taking, close_after
from .listen_bridge import ListenBridge
from .scopes import Deadline, TaskScope
from .tasks.host import LegacyTaskHost
from .tasks.modern_clients import ModernClientTasks, TaskTools, task_route

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_SET_LEVEL_TIMEOUT_S = 10.0


class ModernToLegacy:
    def __init__(
        self,
        settings: Settings,
        sessions: SessionFactory,
        metrics: Metrics,
        codec: RequestStateCodec,
        clock: Callable[[], float] = time.time,
        cache: ResponseCache | None = None,
        failures: UpstreamFailures | None = None,
        tasks: LegacyTaskHost | None = None,
        *,
        on_era_mismatch: Callable[[str], None] = lambda reason: None,
        handshakes: Handshakes | None = None,
    ) -> None:
        """`on_era_mismatch(reason)`: an answer says the upstream is not a legacy server (era
        re-detection). `handshakes`: told when a pooled session's `initialize` fails (readiness)."""
        self._settings = settings
        self.request_timeout_s = settings.upstream.request_timeout_s
        self._declare_all = settings.upstream.declare_capabilities == "all"
        self._collect_window_s = settings.input.collect_window_s
        # Tasks hosted for clients that declare the tasks extension (None: tasks are off).
        self.hosted_tasks = tasks
        self._task_tools = TaskTools()
        # Asked once per request whether it is the tasks extension's (None: tasks are off).
        self._task_router = ModernClientTasks(tasks, self._task_tools, self) if tasks is not None else None
        self.name = settings.upstream.name
        self._metrics = metrics
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self.failures = failures if failures is not None else UpstreamFailures(metrics)
        self.pool = SessionPool(
            self.name,
            settings.upstream.pool,
            owner=self,
            factory=sessions,
            on_change=lambda delta: metrics.upstream_sessions.labels(self.name).inc(delta),
        )
        self.codec = codec
        self._park_ids = ParkIds()
        self._parked: dict[str, LegacyCall] = {}
        self._calls: set[LegacyCall] = set()  # every call whose upstream side still runs
        self._ended = asyncio.Event()  # set whenever a call is unparked or ends
        self.tasks = TaskScope("modern-to-legacy relay")
        self._on_era_mismatch = on_era_mismatch
        self.handshakes = handshakes if handshakes is not None else Handshakes(self.name)
        self.listens: set[ListenBridge] = set()

    # ------------------------------------------------------------ what sessions receive unasked

    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None:
        call = call_taking(session, request)
        if call is not None:
            call.feed(call.machine.upstream_message(request))
            return
        if request.get("method") == "ping":
            answer = m2l.Answer(result={})
        else:
            # No single call to attribute it to (docs/translation.md §4.5 Attribution).
            answer = m2l.Answer(
                error=jsonrpc.error_object(
                    jsonrpc.INTERNAL_ERROR, "no request in progress can take this server request"
                )
            )
        self.tasks.spawn(session.send(answer.response(request["id"])), name="answer-server")

    def on_notification(self, session: LegacyUpstreamSession, note: JSONDict) -> None:
        self._cache.invalidate_for(note)
        call = call_of_notification(session, note)
        if call is not None:
            call.feed(call.machine.upstream_message(note))

    # ------------------------------------------------------------ requests

    def hint(self, method: str) -> m2l.CacheHint:
        config = self._settings.upstream.cache_methods.get(method, self._settings.upstream.cache)
        return m2l.CacheHint(config.ttl_ms, config.scope)

    def handle(
        self, request: ModernRequest, channel: ReplyChannel, caller: Caller
    ) -> Coroutine[Any, Any, tuple[JSONDict, int]]:
        """Run one validated modern request; returns (reply, HTTP status). Not a coroutine itself
        but the one that serves the request: a level less for every resume of a request."""
        # task_route first: most requests are not the extension's, and take has nothing to do for them.
        if self._task_router is not None and task_route(request) is not None:
            return self._routed(request, channel, caller)
        return self._serve(request, channel, caller)

    async def _routed(self, request: ModernRequest, channel: ReplyChannel, caller: Caller) -> tuple[JSONDict, int]:
        """A request the tasks extension may take; served as any other if it does not."""
        assert self._task_router is not None
        reply = await self._task_router.take(request, caller)
        if reply is not None:
            return reply, 200
        return await self._serve(request, channel, caller)

    async def serve_hosted(
        self, request: ModernRequest, caller: Caller, *, hosted_for_s: float, hosted_task: str
    ) -> JSONDict:
        """One round of a call in a task the proxy hosts. No stream: the extension carries no
        progress or logs for a task, and its input requests are the task's `inputRequests`."""
        reply, _status = await self._serve(
            request, NO_STREAM, caller, hosted_for_s=hosted_for_s, hosted_task=hosted_task
        )
        return reply

    async def _serve(
        self,
        request: ModernRequest,
        channel: ReplyChannel,
        caller: Caller,
        *,
        hosted_for_s: float | None = None,
        hosted_task: str | None = None,
    ) -> tuple[JSONDict, int]:
        """`hosted_for_s`: the call runs in a task the proxy hosts, kept that long yet: a tool the
        server may run as a task does (its own task then backs the proxy's), and the call may take
        that long rather than one request's bound."""
        principal, auth_headers = caller.principal, caller.credentials
        params = request.message.get("params")
        if not isinstance(params, dict):  # jsonrpc.params_of, read in place
            params = {}
        if "requestState" in params:
            outcome = await self._resume(request, channel, principal, auth_headers)
        else:
            key = self._cache.key_for(request.method, params, request.version, request.capabilities)
            if key is None:
                outcome = await self._handle(
                    request,
                    params,
                    channel,
                    principal,
                    auth_headers,
                    hosted_for_s=hosted_for_s,
                    hosted_task=hosted_task,
                )
                # Made for this request, under its id (the attached request's): no copy to re-id.
                return outcome.message, outcome.status
            else:
                outcome = await self._cache.fetch(
                    key, principal, lambda: self._handle(request, params, channel, principal, auth_headers)
                )
        return {**outcome.message, "id": request.message["id"]}, outcome.status

    async def _handle(
        self,
        request: ModernRequest,
        params: JSONDict,
        channel: ReplyChannel,
        principal: str,
        auth_headers: dict[str, str],
        *,
        hosted_for_s: float | None = None,
        hosted_task: str | None = None,
    ) -> Outcome:
        """A new request (not a retry carrying requestState) on a pooled legacy session; `params`,
        its params object."""
        message, method = request.message, request.method
        request_id = message["id"]
        # Trace context belongs to this request; the pooled session keeps only credentials.
        if auth_headers:
            trace, auth_headers = meta.trace_of(auth_headers), meta.without_trace(auth_headers)
        else:  # a caller with neither: nothing to sort
            trace, auth_headers = {}, {}
        removed = method_problem(method, None)
        if removed is not None:
            return Outcome(removed.reply(request_id), removed.status)
        # It may ask the client for input: a method that can, from a client that declares a way to answer.
        interactive = method in INPUT_REQUIRED_METHODS and not ALL_INPUT_CAPABILITIES.keys().isdisjoint(
            request.capabilities
        )
        declared = self._declared_for(request.capabilities)
        try:
            session = await self.pool.acquire(
                principal, declared, request.client_info, auth_headers, exclusive=interactive
            )
        except UpstreamError as exc:
            self.handshakes.failed(exc)
            raise self.failures.client_error(exc) from None
        except ProxyError as exc:
            self._check_era(exc)
            raise
        problem = unbacked_method(method, session.modern_capabilities)  # not removed: refused above
        if problem is not None or method == "server/discover":
            self.pool.release(session)
            if problem is not None:
                return Outcome(problem.reply(request_id), problem.status)
            result = m2l.discover_result(session.initialize_result, self.hint("server/discover"))
            if self.hosted_tasks is not None and session.tool_calls_as_tasks:
                result = mt.advertise(result)
            return Outcome(jsonrpc.result_response(request_id, result))
        if request.log_level is not None:
            try:
                await self._ensure_level(session, request.log_level)
            except (UpstreamError, ProxyError, TimeoutError) as exc:
                log.warning("upstream_set_level_failed", upstream=self.name, error=str(exc))
        downstream_token = m2l.progress_token_in(params)
        upstream_id = session.next_id()
        upstream_token = f"p{upstream_id}" if downstream_token is not None else None
        machine = ParkedCall.new(
            method=method,
            params=params,
            capabilities=request.capabilities,
            downstream=DownstreamRequest(request_id, downstream_token, request.log_level),
            principal=principal,
            park_id=self._park_ids.next(),
            upstream=self.name,
            upstream_id=upstream_id,
            server_info=session.server_info,
            cache_hint=self.hint(method) if method in HINTED_METHODS else None,
            collect_window_s=self._collect_window_s,
            detach_timeout_s=self.request_timeout_s,
        )
        call = LegacyCall(self, session, machine, interactive=interactive, upstream_token=upstream_token, trace=trace)
        # Only a server that takes task-augmented calls runs one as a task (TaskTools.runs_as_task
        # asks the same first): for the others, no coroutine per call.
        if method == "tools/call" and session.tool_calls_as_tasks:
            call.as_task = await self._task_tools.runs_as_task(
                session, self.name, params.get("name"), hosted=hosted_for_s is not None
            )
        if hosted_for_s is not None:
            call.timeout_s, call.hosted_task = hosted_for_s, hosted_task
        call.bind(session)
        self._calls.add(call)
        outgoing = meta.carry_trace(m2l.to_upstream(message, upstream_id, upstream_token), trace)
        if interactive:
            call.start_reader(outgoing)
            return await self._attend(call, channel)
        return await self._inline(call, outgoing, channel)

    def _check_era(self, refused: ProxyError) -> None:
        """A pooled session's `initialize` refused (`refused`, the upstream's error in its data):
        the handshake fails; as only a 2026-07-28 server refuses it in the spec's words, the era
        it was taken for may be wrong."""
        upstream = refused.data.get("upstreamError") if isinstance(refused.data, dict) else None
        if upstream is None:
            return  # the proxy's own refusal (a bound reached): nothing the upstream said
        self.handshakes.failed(refused)
        if refused_as_modern(upstream):
            self._on_era_mismatch(MODERN_REFUSAL)

    def declared(self, request: ModernRequest) -> JSONDict:
        """The client capabilities a pooled session for this request declares upstream."""
        return self._declared_for(request.capabilities)

    def _declared_for(self, capabilities: JSONDict) -> JSONDict:
        """What a pooled session for a client declaring `capabilities` declares upstream: the pool
        keeps one session per set, so a server that adapts to its client never serves one client
        what it offered another. `all` declares every input capability, but only the extensions
        the client declares: an extension changes what a server offers (an MCP Apps server offers
        its app tools to hosts that render them), so it is never declared for a client."""
        if self._declare_all:
            extensions = carried_extensions(capabilities)
            if extensions is None:
                return ALL_INPUT_CAPABILITIES  # one object: the pool's key of it is computed once
            return {**ALL_INPUT_CAPABILITIES, "extensions": extensions}
        return capabilities

    async def notify(self, message: JSONDict, caller: Caller) -> None:
        """A client's notification of an extension (docs/translation.md §2.1): sent on a pooled
        session of the caller that declares what the notification's envelope declares (none: the
        session of a client declaring nothing), opened if need be. Nothing answers it, so a failure
        is logged, not reported."""
        envelope = meta.meta_of(message.get("params")) or {}
        capabilities = envelope.get(meta.CLIENT_CAPABILITIES)
        client_info = envelope.get(meta.CLIENT_INFO)
        declared = self._declared_for(capabilities if isinstance(capabilities, dict) else {})
        credentials = meta.without_trace(caller.credentials)

        async def send() -> None:
            info = client_info if isinstance(client_info, dict) else None
            session = await self.pool.acquire(caller.principal, declared, info, credentials, exclusive=False)
            try:
                await session.send(m2l.notification_to_upstream(message))
            finally:
                self.pool.release(session)

        within_s = self._settings.upstream.request_timeout_s
        await deliver_notification(self.name, message.get("method"), within_s, send())

    async def _ensure_level(self, session: LegacyUpstreamSession, level: str | None) -> None:
        """Make the session at least as verbose as this request asks (docs/translation.md §4.4)."""
        if level is None or "logging" not in session.server_capabilities:
            return
        if not meta.level_passes(level, session.log_level):
            await session.call("logging/setLevel", {"level": level}, timeout_s=_SET_LEVEL_TIMEOUT_S)
            session.log_level = level

    async def _inline(self, call: LegacyCall, outgoing: JSONDict, channel: ReplyChannel) -> Outcome:
        """A call that cannot park, read in the handler: no task, no queue. Should the call outlive
        the reply (a -32021 while the server goes on), its stream is handed to a task of the call."""
        exchange: Exchange | None = None  # left here, unless handed over to the call
        outcome: Outcome | None
        handed_over = False
        machine, outbox = call.machine, call.outbox
        lists_tools = machine.state.method == "tools/list"
        # What a session's exchange yields is a JSON-RPC message: every legacy transport classifies
        # each one (HTTP refuses a body holding another, stdio and HTTP+SSE drop it). A TaskCall's
        # reply is made of several exchanges, so the machine checks it itself.
        valid = not call.as_task
        try:
            with Deadline(call.timeout_s):
                try:
                    exchange, reply = await call.open(outgoing)
                    messages = aiter(reply)
                    async for message in messages:
                        if lists_tools and isinstance(message.get("result"), dict):
                            self._task_tools.learn_from(message["result"])
                        call.feed(machine.upstream_message(message, valid=valid))
                        if not outbox:
                            continue
                        action = outbox[0]
                        if type(action) is ReplyClient:
                            # The usual: the final reply first, taken as _drain takes it (what may
                            # follow stays in the outbox), without running _drain.
                            outbox.popleft()
                            outcome = action.outcome
                        else:
                            outcome = await self._drain(call, channel)
                        if outcome is not None:
                            if machine.state.phase == "detached":
                                call.run_out(messages, exchange)
                                handed_over = True
                            return outcome
                    call.feed(call.machine.upstream_ended())
                except UpstreamError as exc:
                    call.feed(call.machine.upstream_failed(exc.failure))
                outcome = await self._drain(call, channel)
                assert outcome is not None, "a call that ended reported no outcome"
                return outcome
        except TimeoutError:
            call.feed(call.machine.timed_out(timed_out(self.name)))
            raise self.failures.timeout(self.name) from None
        except BaseException:
            call.feed(call.machine.client_gone())  # in 2026-07-28 a closed stream is the cancellation
            raise
        finally:
            if exchange is not None and not handed_over:
                if call.finished or not call.busy:
                    await exchange.__aexit__(None, None, None)
                else:  # the stream closes once the call has told the upstream it gives up
                    call.tasks.spawn(close_after(call, exchange), name="legacy-call-close")

    async def _attend(self, call: LegacyCall, channel: ReplyChannel) -> Outcome:
        """Serve the attached request of a call with its own reader until it has its answer."""
        try:
            with Deadline(call.timeout_s):
                while True:
                    outcome = await self._drain(call, channel)
                    if outcome is not None:
                        return outcome
                    call.wakeup.clear()
                    await call.wakeup.wait()
        except TimeoutError:
            call.feed(call.machine.timed_out(timed_out(self.name)))
            raise self.failures.timeout(self.name) from None
        except BaseException:
            call.feed(call.machine.client_gone())
            raise

    async def _drain(self, call: LegacyCall, channel: ReplyChannel) -> Outcome | None:
        """Execute the downstream actions waiting for the attached handler; the outcome, if one came."""
        while call.outbox:
            action = call.outbox.popleft()
            if isinstance(action, RelayToClient):
                if channel.can_stream:
                    await channel.send(action.message)
            elif isinstance(action, ReplyClient):
                return action.outcome
            elif isinstance(action, Park):
                outcome = self._park(call, action)
                if outcome is not None:
                    return outcome
            elif isinstance(action, Fail):
                raise self.failures.client_error(action.failure)
        return None

    def _park(self, call: LegacyCall, park: Park) -> Outcome | None:
        """Hold the call for the client's retry; None when it cannot be held (its refusal follows)."""
        input_settings = self._settings.input
        if call.park_id not in self._parked and len(self._parked) >= input_settings.max_parked:
            call.feed(call.machine.park_refused())
            return None
        self._parked[call.park_id] = call
        self._metrics.parked_calls.set(len(self._parked))
        call.arm(input_settings.park_timeout_s, call.machine.park_expired)
        self._metrics.input_rounds.labels("modern_to_legacy", method_label(call.method)).inc()
        tracing.input_round()
        claims = park.claims
        token = self.codec.mint(
            claims.park_id, claims.principal, claims.method, claims.digest, claims.round, input_settings.park_timeout_s
        )
        result = input_required_result(park.input_requests, token, call.machine.state.server_info)
        return Outcome(jsonrpc.result_response(park.request_id, result))

    async def _resume(
        self, request: ModernRequest, channel: ReplyChannel, principal: str, auth_headers: dict[str, str]
    ) -> Outcome:
        params = jsonrpc.params_of(request.message)
        request_id = request.message["id"]
        claims = self.codec.verify(params.get("requestState"), principal)
        # A call parked on another replica is forwarded there before it reaches this (cluster/);
        # one whose replica nobody can reach is no call here.
        call = self._parked.get(claims.park_id) if claims is not None and self.codec.is_local(claims) else None
        if call is None or call.finished:
            return invalid_state(request_id)
        downstream = DownstreamRequest(request_id, m2l.progress_token_of(request.message), request.log_level)
        spent = call.machine.state.round
        actions = call.machine.retry(request.message, downstream, request.capabilities, claims, principal)
        if call.machine.state.round == spent:  # refused: the parked call is left as it was
            refusal = actions[0]
            assert isinstance(refusal, ReplyClient)
            return refusal.outcome
        call.disarm()
        self.unpark(call)
        # The retry may bring a refreshed token (the same principal): the answers and whatever
        # follows on the call's session go upstream with it, not with the one it was parked with.
        call.session.auth_headers = meta.without_trace(auth_headers)
        if actions and isinstance(actions[0], DeliverAnswers):
            try:
                for response in actions[0].responses:
                    await call.session.send(response)
            except UpstreamError as exc:
                actions = call.machine.delivery_failed(exc.failure)
            except BaseException:
                call.feed(call.machine.client_gone())
                raise
            else:
                actions = call.machine.answers_delivered()
        call.feed(actions)
        return await self._attend(call, channel)

    # ------------------------------------------------------------ calls and parking

    def invalidate_for(self, note: JSONDict) -> None:
        self._cache.invalidate_for(note)

    def withdraw(self, request_state: str, principal: str) -> None:
        """A parked round of a hosted task that no retry will resume: the call is given up."""
        claims = self.codec.verify(request_state, principal)
        call = self._parked.get(claims.park_id) if claims is not None else None
        if call is not None and not call.finished:
            call.disarm()
            self.unpark(call)
            call.feed(call.machine.withdrawn())

    def hosted_call(self, task_id: str) -> LegacyCall | None:
        return next((c for c in self._calls if c.hosted_task == task_id and c.upstream_task_id), None)

    def unpark(self, call: LegacyCall) -> None:
        if self._parked and self._parked.pop(call.park_id, None) is not None:
            self._metrics.parked_calls.set(len(self._parked))
            self._ended.set()

    async def settle(self, timeout_s: float) -> int:
        """Shutdown, once no handler is left: the calls still running upstream (parked ones, and
        those resumed by retries that other replicas forward here) get up to `timeout_s` to be
        resumed and finish, instead of ending with the process. Returns how many are left."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._calls:
                    self._ended.clear()
                    await self._ended.wait()
        return len(self._calls)

    def forget(self, call: LegacyCall) -> None:
        """A call whose upstream side ended: once its own tasks are done, nothing holds it."""
        if not call.busy:
            self._calls.discard(call)
            self._ended.set()
        else:
            self.tasks.spawn(self._forget_after(call), name="legacy-call-end")

    async def _forget_after(self, call: LegacyCall) -> None:
        await call.tasks.drain()
        self._calls.discard(call)
        self._ended.set()

    def count_reinitialized(self) -> None:
        self._metrics.upstream_reinitialized.labels(self.name).inc()

    # ------------------------------------------------------------ housekeeping

    async def maintain(self) -> None:
        await self.pool.maintain()

    async def listen(self, request: ModernRequest, caller: Caller) -> AsyncGenerator[JSONDict, None]:
        """A subscriptions/listen stream over a legacy session of its own (docs/translation.md §4.6),
        relayed by its ListenBridge; the session is discarded when the stream ends."""
        bridge = ListenBridge(self, request, caller.principal, caller.credentials)
        try:
            async with contextlib.aclosing(bridge.relayed(self._settings.streams.keepalive_s)) as messages:
                async for message in messages:
                    yield message
        finally:
            self.tasks.spawn(bridge.close(), name="listen-close")

    def end_streams(self) -> None:
        """Shutdown begins: every listen stream ends with its completion result."""
        for bridge in list(self.listens):
            bridge.queue.put_nowait(None)

    async def close_all(self) -> None:
        for call in list(self._calls):
            call.feed(call.machine.shutdown())
        self.end_streams()
        for bridge in list(self.listens):
            await bridge.close()
        for call in list(self._calls):
            await call.tasks.drain()
        await self.tasks.drain()
        await self.pool.close_all()


async def probe(relay: ModernToLegacy, *, fresh: bool) -> None:
    """Readiness for a legacy upstream: `fresh`, a legacy `initialize` and its end on a session of
    its own, as a new client's would go (a Streamable HTTP server); otherwise a pooled session
    answers ping (a stdio server: its process is started once, by the first of them)."""
    try:
        if fresh:
            await relay.pool.handshake()
            return
        session = await relay.pool.acquire("", {}, None, {}, exclusive=False)
    except ProxyError as exc:
        relay._check_era(exc)
        raise
    try:
        await session.call("ping", timeout_s=5.0)
    finally:
        relay.pool.release(session)
