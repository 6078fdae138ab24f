"""Modern clients in downstream of a legacy upstream: the driver of protocol.parked_call.

Requests run on pooled legacy sessions. Each is a ParkedCall machine; this module executes its
actions: it reads the upstream reply, answers the server's requests, relays notifications, keeps
a call parked between a modern client's rounds and resumes it on the retry.

A call that cannot park (no input capability, or a method that takes no input) is read in the
request's own handler; one that can gets a reader task of its own, owned by the call, because
its upstream stream outlives the handler while it is parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import structlog

from .. import tracing
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import jsonrpc, meta
from ..protocol import legacy_tasks as lt
from ..protocol import modern_tasks as mt
from ..protocol import modern_to_legacy as m2l
from ..protocol import task_extension as te
from ..protocol.capabilities import ALL_INPUT_CAPABILITIES, carried_extensions
from ..protocol.detection import MODERN_REFUSAL, refused_as_modern
from ..protocol.methods import HINTED_METHODS, INPUT_REQUIRED_METHODS
from ..protocol.modern_validate import ModernRequest, method_problem
from ..protocol.outcome import Outcome, UpstreamFailure, timed_out
from ..protocol.parked_call import (
    Abandon,
    Action,
    AnswerServer,
    DeliverAnswers,
    Detach,
    DownstreamRequest,
    Fail,
    Park,
    ParkedCall,
    RelayToClient,
    Release,
    ReplyClient,
    StartCollecting,
    input_required_result,
    invalid_state,
)
from ..protocol.request_state import ParkIds, RequestStateCodec
from ..state.cache import ResponseCache
from ..upstream.base import Reply
from ..upstream.errors import UpstreamError, UpstreamSessionGone
from ..upstream.legacy_session import LegacyUpstreamSession, SessionFactory, SessionPool
from .channel import NO_STREAM, Caller, ReplyChannel
from .failures import UpstreamFailures, deliver_notification
from .scopes import Deadline, TaskScope
from .tasks.host import LegacyTaskHost, TaskChannel, refusals

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_ABANDON_TIMEOUT_S = 5.0  # for telling the upstream that a call is given up
_SET_LEVEL_TIMEOUT_S = 10.0
_PEEK_TIMEOUT_S = 2.0  # for the status message of the server's task behind a hosted one
_TOOL_PAGES_MAX = 100  # tools/list pages walked at most to learn which tools run only as tasks
_DOWNSTREAM = (RelayToClient, ReplyClient, Park, Fail)  # actions only the attached handler executes


class LegacyCall:
    """Executes one ParkedCall on its upstream session.

    Downstream actions wait in `outbox` for the handler of the attached request, which is the only
    writer of that request's reply. Upstream actions run at once, in tasks the call owns.
    """

    def __init__(
        self,
        relay: ModernToLegacy,
        session: LegacyUpstreamSession,
        machine: ParkedCall,
        *,
        interactive: bool,
        upstream_token: str | None,
        trace: dict[str, str],
    ) -> None:
        self.relay = relay
        self.session = session
        self.machine = machine
        self.interactive = interactive
        self.upstream_token = upstream_token
        self.trace = trace  # this request's trace context (not the session's)
        self.outbox: deque[Action] = deque()
        self.wakeup = asyncio.Event()
        self.tasks = TaskScope("legacy call")
        self.as_task = False  # a tool the server runs only as a task: made as one (_TaskCall)
        # How long the client waits for a round of it: a request's bound, or a hosted task's retention.
        self.timeout_s = relay.request_timeout_s
        self.hosted_task: str | None = None  # the id of the task the proxy hosts it in, if one
        self.upstream_task_id: str | None = None  # that task, once the server created it
        self.task_known = asyncio.Event()  # the server's answer to the task-augmented call was read
        self.finished = False
        self._timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def method(self) -> str:
        return self.machine.state.method

    @property
    def park_id(self) -> str:
        return self.machine.state.park_id

    # ------------------------------------------------------------ events in, actions out

    def feed(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, _DOWNSTREAM):
                self.outbox.append(action)
                self.wakeup.set()
            elif isinstance(action, AnswerServer):
                self.tasks.spawn(self._answer(action.response), name="answer-server")
            elif isinstance(action, StartCollecting):
                self.arm(action.delay_s, self.machine.collect_window_elapsed)
            elif isinstance(action, Detach):
                self.arm(action.timeout_s, self.machine.detach_expired)
            elif isinstance(action, Abandon):
                self.disarm()
                self.relay.unpark(self)
                self.tasks.spawn(self._abandon(action.reason, action.responses), name="abandon")
            elif isinstance(action, Release):
                self.finish()
            else:  # DeliverAnswers: only a retry returns it, and its handler executes it
                raise AssertionError(f"unexpected action {action!r}")

    def arm(self, delay_s: float, event: Callable[[], list[Action]]) -> None:
        self.disarm()
        self._timer = asyncio.get_running_loop().call_later(delay_s, lambda: self.feed(event()))

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------ the upstream side

    def takes(self, request: JSONDict) -> bool:
        """A server request that came outside any call's stream (the GET stream, stdio) is this
        call's, the one holding the session, unless the server runs the call as a task: then only
        one tagged with that task is (2025-11-25 tasks.mdx: a task's requests MUST carry the
        related-task `_meta`). Servers ask of their own accord too (server-everything lists the
        roots of each new session), and such a request must not end the task's call."""
        if not self.as_task:
            return True
        related = (meta.meta_of(request.get("params")) or {}).get(meta.RELATED_TASK)
        task_id = related.get("taskId") if isinstance(related, dict) else None
        if not isinstance(task_id, str):
            return False
        # Before the reply that creates the task is read, a tagged request can only be its.
        return self.upstream_task_id is None or task_id == self.upstream_task_id

    def bind(self, session: LegacyUpstreamSession) -> None:
        self.session = session
        session.active.add(self)
        if self.upstream_token is not None:
            session.progress_routes[self.upstream_token] = self
        if self.interactive:
            session.exclusive = self

    async def open(self, outgoing: JSONDict) -> _Held:
        """Send the request; a session the upstream forgot (HTTP 404) is opened again and the
        request sent once more, which is safe: it was not executed (docs/translation.md §4.3)."""
        exchange = self._exchange(outgoing)
        try:
            return _Held(exchange, await exchange.__aenter__())
        except UpstreamSessionGone:
            try:
                self.bind(await self.relay.pool.replace(self.session))
            except ProxyError as exc:  # it refused to open a session again: still a session gone
                raise UpstreamSessionGone(self.relay.name, f"forgot the session: {exc.message}") from None
            self.relay.count_reinitialized()
            exchange = self._exchange(outgoing)
            return _Held(exchange, await exchange.__aenter__())

    def _exchange(self, outgoing: JSONDict) -> AbstractAsyncContextManager[Reply]:
        return _TaskCall(self, outgoing) if self.as_task else self.session.request(outgoing, self.trace)

    def start_reader(self, outgoing: JSONDict) -> None:
        self._reader = self.tasks.spawn(self._read(outgoing), name="legacy-call-reader")

    def run_out(self, messages: Any, held: _Held) -> None:
        """Read the rest of a stream the handler opened, once the client has its answer."""
        self._reader = self.tasks.spawn(_run_out(self, messages, held), name="legacy-call-rest")

    async def _read(self, outgoing: JSONDict) -> None:
        try:
            held = await self.open(outgoing)
            try:
                await self.consume(held.reply)
            finally:
                await held.close()
        except UpstreamError as exc:
            self.feed(self.machine.upstream_failed(exc.failure))
        except Exception:
            # Whatever else ends the reader ends the call too: the attached request hears of it
            # now instead of waiting out its deadline for a reader that is gone.
            log.exception("legacy_call_reader_failed", upstream=self.session.name, method=self.method)
            self.feed(self.machine.upstream_failed(_reader_failed(self.session.name)))

    async def consume(self, messages: Reply) -> None:
        """Feed the reply stream to the machine until the call is over."""
        async for message in messages:
            self.feed(self.machine.upstream_message(message))
            if self.machine.phase == "done":
                return
        self.feed(self.machine.upstream_ended())

    async def _answer(self, response: JSONDict) -> None:
        await self.session.send(response)

    async def _abandon(self, reason: str, responses: tuple[JSONDict, ...]) -> None:
        """Answer what the server waits for and tell it to stop, while its stream is still open and
        before the session serves anyone else (some servers mishandle a cancellation for a request
        whose stream already closed); then free the session."""
        try:
            if self.as_task:
                # Given up while the server may still be creating its task: the answer names the
                # task to cancel (a notifications/cancelled would leave it running).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_ABANDON_TIMEOUT_S):
                        await self.task_known.wait()
            with contextlib.suppress(UpstreamError, ProxyError, TimeoutError):
                async with asyncio.timeout(_ABANDON_TIMEOUT_S):
                    for response in responses:
                        await self.session.send(response)
                    if self.upstream_task_id is not None:
                        # A task is cancelled by tasks/cancel, never by notifications/cancelled
                        # (2025-11-25 tasks.mdx); its reply does not matter.
                        request = m2l.task_cancel_request(self.session.next_id(), self.upstream_task_id)
                        async with self.session.request(request, self.trace) as reply:
                            async for _ in reply:
                                pass
                    else:
                        cancel = {"requestId": self.machine.state.upstream_id, "reason": reason}
                        await self.session.send(jsonrpc.notification("notifications/cancelled", cancel))
        finally:
            self.finish()
        log.info("legacy_call_abandoned", upstream=self.session.name, method=self.method, reason=reason)

    def finish(self) -> None:
        """The upstream call is over: free the session (once)."""
        if self.finished:
            return
        self.finished = True
        self.disarm()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        self.session.progress_routes.pop(self.upstream_token or "", None)
        self.session.active.discard(self)
        if self.session.exclusive is self:
            self.session.exclusive = None
        self.relay.pool.release(self.session)
        self.relay.unpark(self)
        self.relay.forget(self)


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
    ) -> None:
        self._settings = settings
        self.request_timeout_s = settings.upstream.request_timeout_s
        # Tasks hosted for clients that declare the tasks extension (None: tasks are off).
        self.hosted_tasks = tasks
        self.name = settings.upstream.name
        self._metrics = metrics
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self.failures = failures if failures is not None else UpstreamFailures(metrics)
        self.pool = SessionPool(self.name, settings.upstream.pool, owner=self, factory=sessions)
        self.pool.on_change = lambda delta: metrics.upstream_sessions.labels(self.name).inc(delta)
        self.codec = codec
        self._park_ids = ParkIds()
        self._parked: dict[str, LegacyCall] = {}
        self._calls: set[LegacyCall] = set()  # every call whose upstream side still runs
        self._ended = asyncio.Event()  # set whenever a call is unparked or ends
        self.tasks = TaskScope("modern-to-legacy relay")
        # Called when an answer says the upstream is not a legacy server (era re-detection).
        self.on_era_mismatch: Callable[[str], None] = lambda reason: None
        self.listens: set[ListenBridge] = set()
        # Tools the upstream listed with taskSupport "required" (learnt from its tools/list replies,
        # or from a walk of its list before the first tools/call of a server that takes tasks).
        self._task_tools: set[str] = set()
        # ... and those it may run as tasks (optional or required): a client that declares the tasks
        # extension gets a task for a call of one of those.
        self._task_capable: set[str] = set()
        self._task_tools_learnt = False

    # ------------------------------------------------------------ what sessions receive unasked

    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None:
        call = session.exclusive
        if isinstance(call, LegacyCall) and not call.finished and call.takes(request):
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
        method = note.get("method")
        params = jsonrpc.params_of(note)
        call: Any = None
        if method == "notifications/progress":
            token = params.get("progressToken")
            call = session.progress_routes.get(token) if isinstance(token, str) else None
        elif method == "notifications/cancelled":
            call = session.exclusive
        elif method == "notifications/message" and len(session.active) == 1:
            # Without a per-request stream (stdio), a log belongs to the one call running, if one.
            call = next(iter(session.active))
        # Other logs and list changes outside a call's stream have no modern request to go to.
        if isinstance(call, LegacyCall) and not call.finished:
            call.feed(call.machine.upstream_message(note))

    # ------------------------------------------------------------ requests

    def hint(self, method: str) -> m2l.CacheHint:
        config = self._settings.upstream.cache_methods.get(method, self._settings.upstream.cache)
        return m2l.CacheHint(config.ttl_ms, config.scope)

    async def handle(self, request: ModernRequest, channel: ReplyChannel, caller: Caller) -> tuple[JSONDict, int]:
        """Run one validated modern request; returns (reply, HTTP status)."""
        tasks = self.hosted_tasks
        if tasks is not None:
            if request.method in te.METHODS:
                return await self._task_request(tasks, request, caller), 200
            if await self._becomes_task(request, caller):
                return await self._create_task(tasks, request, caller), 200
        return await self._serve(request, channel, caller)

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
        params = jsonrpc.params_of(request.message)
        if "requestState" in params:
            outcome = await self._resume(request, channel, principal, auth_headers)
        else:
            key = self._cache.key_for(request.method, params, request.version, request.capabilities)
            if key is None:
                outcome = await self._handle(
                    request, channel, principal, auth_headers, hosted_for_s=hosted_for_s, hosted_task=hosted_task
                )
            else:
                outcome = await self._cache.fetch(
                    key, principal, lambda: self._handle(request, channel, principal, auth_headers)
                )
        return {**outcome.message, "id": request.message["id"]}, outcome.status

    async def _handle(
        self,
        request: ModernRequest,
        channel: ReplyChannel,
        principal: str,
        auth_headers: dict[str, str],
        *,
        hosted_for_s: float | None = None,
        hosted_task: str | None = None,
    ) -> Outcome:
        """A new request (not a retry carrying requestState) on a pooled legacy session."""
        request_id = request.message["id"]
        # Trace context belongs to this request; the pooled session keeps only credentials.
        trace = meta.trace_of(auth_headers)
        auth_headers = meta.without_trace(auth_headers)
        removed = method_problem(request.method, None)
        if removed is not None:
            return Outcome(removed.reply(request_id), removed.status)
        interactive = request.method in INPUT_REQUIRED_METHODS and any(
            k in request.capabilities for k in ALL_INPUT_CAPABILITIES
        )
        declared = self._declared(request)
        try:
            session = await self.pool.acquire(
                principal, declared, request.client_info, auth_headers, exclusive=interactive
            )
        except UpstreamError as exc:
            raise self.failures.client_error(exc) from None
        except ProxyError as exc:
            self._check_era(exc)
            raise
        problem = method_problem(request.method, session.modern_capabilities)
        if problem is not None or request.method == "server/discover":
            self.pool.release(session)
            if problem is not None:
                return Outcome(problem.reply(request_id), problem.status)
            result = m2l.discover_result(session.initialize_result, self.hint("server/discover"))
            if self.hosted_tasks is not None and m2l.runs_tool_calls_as_tasks(session.server_capabilities):
                result = mt.advertise(result)
            return Outcome(jsonrpc.result_response(request_id, result))
        try:
            await self._ensure_level(session, request.log_level)
        except (UpstreamError, ProxyError, TimeoutError) as exc:
            log.warning("upstream_set_level_failed", upstream=self.name, error=str(exc))
        downstream_token = m2l.progress_token_of(request.message)
        upstream_id = session.next_id()
        upstream_token = f"p{upstream_id}" if downstream_token is not None else None
        machine = ParkedCall.new(
            method=request.method,
            params=jsonrpc.params_of(request.message),
            capabilities=request.capabilities,
            downstream=DownstreamRequest(request_id, downstream_token, request.log_level),
            principal=principal,
            park_id=self._park_ids.next(),
            upstream=self.name,
            upstream_id=upstream_id,
            server_info=session.server_info,
            cache_hint=self.hint(request.method) if request.method in HINTED_METHODS else None,
            collect_window_s=self._settings.input.collect_window_s,
            detach_timeout_s=self._settings.upstream.request_timeout_s,
        )
        call = LegacyCall(self, session, machine, interactive=interactive, upstream_token=upstream_token, trace=trace)
        if request.method == "tools/call" and m2l.runs_tool_calls_as_tasks(session.server_capabilities):
            if not self._task_tools_learnt:
                await self._learn_task_tools(session)
            name = jsonrpc.params_of(request.message).get("name")
            call.as_task = name in self._task_tools or (hosted_for_s is not None and name in self._task_capable)
        if hosted_for_s is not None:
            call.timeout_s, call.hosted_task = hosted_for_s, hosted_task
        call.bind(session)
        self._calls.add(call)
        outgoing = meta.carry_trace(m2l.to_upstream(request.message, upstream_id, upstream_token), call.trace)
        if interactive:
            call.start_reader(outgoing)
            return await self._attend(call, channel)
        return await self._inline(call, outgoing, channel)

    async def _learn_task_tools(self, session: LegacyUpstreamSession) -> None:
        """Walk the server's tools/list once, for the tools it runs only as tasks (a client may call
        a tool without listing first)."""
        self._task_tools_learnt = True
        cursor: Any = None
        try:
            for _ in range(_TOOL_PAGES_MAX):
                result = await session.call("tools/list", {"cursor": cursor} if cursor is not None else None)
                self._learn_from(result)
                cursor = result.get("nextCursor")
                if cursor is None:
                    return
        except (UpstreamError, ProxyError, TimeoutError) as exc:
            self._task_tools_learnt = False  # tried again with the next call
            log.warning("upstream_tools_unlisted", upstream=self.name, error=str(exc))

    def _check_era(self, refused: ProxyError) -> None:
        """A pooled session's `initialize` refused (`refused`, the upstream's error in its data):
        as only a 2026-07-28 server refuses it, the era it was taken for is wrong."""
        upstream = refused.data.get("upstreamError") if isinstance(refused.data, dict) else None
        if refused_as_modern(upstream):
            self.on_era_mismatch(MODERN_REFUSAL)

    def _declared(self, request: ModernRequest) -> JSONDict:
        """The client capabilities a pooled session for this request declares upstream."""
        return self._declared_for(request.capabilities)

    def _declared_for(self, capabilities: JSONDict) -> JSONDict:
        """What a pooled session for a client declaring `capabilities` declares upstream: the pool
        keeps one session per set, so a server that adapts to its client never serves one client
        what it offered another. `all` declares every input capability, but only the extensions
        the client declares: an extension changes what a server offers (an MCP Apps server offers
        its app tools to hosts that render them), so it is never declared for a client."""
        if self._settings.upstream.declare_capabilities == "all":
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

    def _learn_from(self, tools_list: JSONDict) -> None:
        self._task_tools |= m2l.task_required_tools(tools_list)
        self._task_capable |= m2l.task_capable_tools(tools_list)

    # ------------------------------------------------------------ tasks (the tasks extension)

    async def _becomes_task(self, request: ModernRequest, caller: Caller) -> bool:
        """A tools/call from a client that declares the tasks extension, of a tool the server may
        run as a task: the proxy answers with a task (the extension lets the server decide which
        calls become tasks; the server's own tool list says which take long)."""
        params = jsonrpc.params_of(request.message)
        if request.method != "tools/call" or "requestState" in params or not te.declared(request.capabilities):
            return False
        if not self._task_tools_learnt:
            credentials = meta.without_trace(caller.credentials)
            declared = self._declared(request)
            try:
                session = await self.pool.acquire(
                    caller.principal, declared, request.client_info, credentials, exclusive=False
                )
            except (UpstreamError, ProxyError):
                return False  # the plain call meets the same failure, and reports it
            try:
                if m2l.runs_tool_calls_as_tasks(session.server_capabilities):
                    await self._learn_task_tools(session)
            finally:
                self.pool.release(session)
        return params.get("name") in self._task_capable

    async def _create_task(self, tasks: LegacyTaskHost, request: ModernRequest, caller: Caller) -> JSONDict:
        """The call runs in a task the proxy hosts: the handle now; each input round the call asks
        for becomes the task's `inputRequests`, answered by tasks/update."""
        message = request.message
        first = dataclasses.replace(request, message={**message, "params": lt.untasked(message)["params"]})

        async def run(channel: TaskChannel) -> JSONDict:
            current = first
            while True:
                # Each round goes with the caller's latest credentials (a refreshed token sent with
                # its tasks/get or tasks/update), as a client's own retry would.
                latest = channel.latest if isinstance(channel.latest, Caller) else caller
                # No stream: the extension carries no progress or logs for a task, and its input
                # requests are the task's `inputRequests`.
                reply, _status = await self._serve(
                    current, NO_STREAM, latest, hosted_for_s=channel.time_left(), hosted_task=channel.task_id
                )
                result = reply.get("result")
                if not (isinstance(result, dict) and result.get("resultType") == "input_required"):
                    return reply
                requests, state = result.get("inputRequests"), result.get("requestState")
                if not isinstance(requests, dict) or not requests or not isinstance(state, str):
                    return reply  # not a round the proxy parked: the call's answer as it is
                try:
                    answers = await channel.ask(requests)
                except BaseException:  # the task was cancelled (or the proxy stops): no retry comes
                    self._withdraw(state, caller.principal)
                    raise
                params = {**first.message["params"], "inputResponses": answers, "requestState": state}
                current = dataclasses.replace(first, message={**first.message, "params": params})

        with refusals():
            record = await tasks.start(caller.principal, first.message, run)
        return jsonrpc.result_response(message["id"], mt.create_result(record))

    async def _with_upstream_status(self, record: lt.TaskRecord) -> lt.TaskRecord:
        """A running task as shown, with the status message of the server's own task behind it
        (a 2025-11-25 server tells its progress only in its tasks/get; server-everything's research
        says which stage it is at), when its call runs here."""
        call = next((c for c in self._calls if c.hosted_task == record.task_id and c.upstream_task_id), None)
        if call is None or call.upstream_task_id is None or call.finished:
            return record
        try:
            task = await call.session.call("tasks/get", {"taskId": call.upstream_task_id}, timeout_s=_PEEK_TIMEOUT_S)
        except (UpstreamError, ProxyError, TimeoutError) as exc:
            log.info("upstream_task_status_unread", upstream=self.name, error=str(exc))
            return record
        message = task.get("statusMessage")
        return lt.told(record, message) if isinstance(message, str) else record

    def _withdraw(self, request_state: str, principal: str) -> None:
        claims = self.codec.verify(request_state, principal)
        call = self._parked.get(claims.park_id) if claims is not None else None
        if call is not None and not call.finished:
            call.disarm()
            self.unpark(call)
            call.feed(call.machine.withdrawn())

    async def _task_request(self, tasks: LegacyTaskHost, request: ModernRequest, caller: Caller) -> JSONDict:
        message, principal = request.message, caller.principal
        with refusals():
            if not te.declared(request.capabilities):
                raise mt.missing_extension()
            if request.method == "tasks/cancel":
                await tasks.withdraw(principal, message)
                return jsonrpc.result_response(message["id"], mt.ack())
            record = await tasks.record(principal, message)  # the caller's own task, or refused
            tasks.seen_from(record, caller)
            if request.method == "tasks/get":
                if not record.terminal:
                    record = await self._with_upstream_status(record)
                return jsonrpc.result_response(message["id"], mt.get_result(record))
            await tasks.answer(principal, message, mt.input_responses(message))
        return jsonrpc.result_response(message["id"], mt.ack())

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
        held: _Held | None = None
        handed_over = False
        try:
            with Deadline(call.timeout_s):
                try:
                    held = await call.open(outgoing)
                    messages = aiter(held.reply)
                    async for message in messages:
                        if call.method == "tools/list" and isinstance(message.get("result"), dict):
                            self._learn_from(message["result"])
                        call.feed(call.machine.upstream_message(message))
                        outcome = await self._drain(call, channel) if call.outbox else None
                        if outcome is not None:
                            if call.machine.phase == "detached":
                                call.run_out(messages, held)
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
            if held is not None and not handed_over:
                if call.finished or not call.tasks:
                    await held.close()
                else:  # the stream closes once the call has told the upstream it gives up
                    call.tasks.spawn(_close_after(call, held), name="legacy-call-close")

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

    def unpark(self, call: LegacyCall) -> None:
        if self._parked.pop(call.park_id, None) is not None:
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
        if not call.tasks:
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
        """A subscriptions/listen stream over a legacy session of its own (docs/translation.md §4.6):
        the acknowledgement, then what the session's GET stream brings that was asked for. It ends
        when the session is gone (the client may listen again) or, at shutdown, with its
        completion result."""
        bridge = ListenBridge(self, request, caller.principal, caller.credentials)
        try:
            yield await bridge.open()
            while True:
                try:
                    async with asyncio.timeout(self._settings.streams.keepalive_s):
                        message = await bridge.queue.get()
                except TimeoutError:
                    if not bridge.alive:
                        return
                    continue
                if message is None:
                    yield m2l.listen_closed(bridge.subscription_id)
                    return
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


def _reader_failed(upstream: str) -> UpstreamFailure:
    """A reader that failed for a reason of the proxy's own: the client gets -32603; it counts as
    an upstream exchange that ended unexpectedly."""
    return UpstreamFailure(upstream, "unavailable", jsonrpc.INTERNAL_ERROR, "could not be relayed (internal error)")


class _TaskCall:
    """The exchange of a call the server runs as a task: the call made task-augmented, then its
    `tasks/result` read as the call's reply (its input requests arrive on that stream, as the
    2025-11-25 SDKs deliver them). What the server sends before the task exists (a question it asks
    first) is the call's like any other message; a server that answers the call at once gives the
    reply itself.

    The task-augmented call is read by a task of the call's own, to its answer even if the call is
    given up meanwhile: the task it makes is then known, and cancelled (LegacyCall._abandon waits
    for it; a notifications/cancelled would leave the task running)."""

    __slots__ = ("_call", "_head", "_incoming", "_outgoing", "_streams")

    def __init__(self, call: LegacyCall, outgoing: JSONDict) -> None:
        self._call = call
        self._outgoing = outgoing
        self._streams = contextlib.AsyncExitStack()
        self._head: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        # The call's messages up to its answer; None once it ended, an exception if it failed.
        self._incoming: asyncio.Queue[JSONDict | BaseException | None] = asyncio.Queue()

    async def __aenter__(self) -> Reply:
        self._call.tasks.spawn(self._create(), name="legacy-task-create")
        status, headers = await self._head
        return _TaskReply(self, status, headers)

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._streams.__aexit__(*exc_info)

    async def _create(self) -> None:
        call = self._call
        try:
            async with call.session.request(m2l.task_augmented(self._outgoing), call.trace) as reply:
                self._head.set_result((reply.status, reply.headers))
                async for message in reply:
                    if "method" not in message:
                        call.upstream_task_id = m2l.created_task_id(message)
                        self._incoming.put_nowait(message)
                        break
                    self._incoming.put_nowait(message)
        except Exception as exc:  # for the reader to raise; nobody may be reading any more
            if not self._head.done():
                self._head.set_exception(exc)
            self._incoming.put_nowait(exc)
        finally:
            if not self._head.done():  # cancelled before the server answered at all
                self._head.cancel()
            self._incoming.put_nowait(None)
            call.task_known.set()

    async def messages(self) -> AsyncGenerator[JSONDict, None]:
        call, call_id = self._call, self._outgoing["id"]
        while (message := await self._incoming.get()) is not None:
            if isinstance(message, BaseException):
                raise message
            if "method" in message:
                yield message  # the server's question before it made the task, or a notification
                continue
            task_id = m2l.created_task_id(message)
            if task_id is None:
                yield m2l.as_call_reply(message, call_id)
                return
            waited = call.session.request(m2l.task_result_request(call.session.next_id(), task_id), call.trace)
            result = await self._streams.enter_async_context(waited)
            async for message in result:
                yield message if "method" in message else m2l.as_call_reply(message, call_id)
            return


class _TaskReply:
    """The reply of a _TaskCall: the call's stream up to the task, then its tasks/result stream."""

    __slots__ = ("_exchange", "headers", "status")

    def __init__(self, exchange: _TaskCall, status: int, headers: Any) -> None:
        self._exchange = exchange
        self.status = status
        self.headers = headers

    def __aiter__(self) -> AsyncGenerator[JSONDict, None]:
        return self._exchange.messages()


class _Held:
    """An upstream exchange entered by hand, so that whoever ends up holding it (the handler, or
    the call once the handler has answered) closes it, once."""

    __slots__ = ("_exchange", "reply")

    def __init__(self, exchange: AbstractAsyncContextManager[Reply], reply: Reply) -> None:
        self._exchange: AbstractAsyncContextManager[Reply] | None = exchange
        self.reply = reply

    async def close(self) -> None:
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            await exchange.__aexit__(None, None, None)


async def _run_out(call: LegacyCall, messages: Any, held: _Held) -> None:
    """The rest of a detached call's stream, read by the call itself until the call is over."""
    try:
        with contextlib.suppress(UpstreamError):
            async for message in messages:
                call.feed(call.machine.upstream_message(message))
                if call.finished:
                    return
            call.feed(call.machine.upstream_ended())
    finally:
        await held.close()


async def _close_after(call: LegacyCall, held: _Held) -> None:
    """Close a call's upstream stream once the call has told the upstream what it had to."""
    try:
        await call.tasks.drain()
    finally:
        await held.close()


class ListenBridge:
    """One modern `subscriptions/listen` stream over a legacy session of its own (docs/translation.md §4.6).

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
        self._session: LegacyUpstreamSession | None = None
        self._unwatch: Callable[[], None] = lambda: None

    # SessionOwner: what the dedicated session's GET stream brings.
    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None:
        self._relay.on_server_request(session, request)  # nobody to ask: ping answered, others refused

    def on_notification(self, session: LegacyUpstreamSession, note: JSONDict) -> None:
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
        watched: list[lt.TaskRecord] = []
        if "taskIds" in wanted:
            if not te.declared(self._request.capabilities):
                raise ProxyError(
                    jsonrpc.MISSING_REQUIRED_CAPABILITY, mt.MISSING_MESSAGE, refused=True, data=mt.MISSING_DATA
                )
            with refusals():
                task_ids = mt.listened_task_ids(wanted)
            tasks = self._relay.hosted_tasks
            # Only the caller's own tasks, running or kept, are acknowledged (and then followed).
            watched = await tasks.known(self._principal, task_ids) if tasks is not None else []
        uris = wanted.get("resourceSubscriptions", [])
        if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "resourceSubscriptions must be a list of URIs", refused=True)
        try:
            session = await self._relay.pool.open_dedicated(
                self._request.capabilities, self._request.client_info, self._auth_headers, owner=self, push_wait_s=0.25
            )
        except UpstreamError as exc:
            raise self._relay.failures.client_error(exc) from None
        self._session = session
        self._relay.listens.add(self)
        subscribed: list[str] = []
        resources = session.server_capabilities.get("resources")
        if uris and isinstance(resources, dict) and resources.get("subscribe") and session.push_channel:
            for uri in uris:
                try:
                    await session.call("resources/subscribe", {"uri": uri}, timeout_s=_SET_LEVEL_TIMEOUT_S)
                    subscribed.append(uri)
                except (UpstreamError, ProxyError, TimeoutError) as exc:
                    log.info("upstream_subscribe_refused", upstream=self._relay.name, error=str(exc))
        self.honored = m2l.honored_filter(wanted, session.server_capabilities, session.push_channel, subscribed)
        if watched and self._relay.hosted_tasks is not None:
            self.honored["taskIds"] = [record.task_id for record in watched]
            self._unwatch = self._relay.hosted_tasks.watch(self._principal, watched, self._task_changed)
        return m2l.acknowledgement(self.honored, self.subscription_id)

    def _task_changed(self, record: lt.TaskRecord) -> None:
        self.queue.put_nowait(mt.notification(record, self.subscription_id))

    async def close(self) -> None:
        session = self._session
        self._unwatch()
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
    try:
        session = await relay.pool.acquire("", {}, None, {}, exclusive=False)
    except ProxyError as exc:
        relay._check_era(exc)
        raise
    try:
        await session.call("ping", timeout_s=5.0)
    finally:
        relay.pool.release(session)
