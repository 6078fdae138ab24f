"""Modern clients' tasks on a legacy upstream (the 2026-07-28 tasks extension, served by
relay/modern_to_legacy.py), and the 2025-11-25 tasks the server itself runs a tool call in.

Two kinds of task meet here. A client that declares the tasks extension gets a task the proxy hosts
(relay/tasks/host.py) for a call of a tool the server may run as one; ModernClientTasks decides
which requests those are, once per request, and serves them. And a tool the server runs as a task
(taskSupport "required", or "optional" in a hosted task) is called task-augmented: TaskCall is that
call's upstream exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import structlog

from ...errors import ProxyError
from ...protocol import jsonrpc, meta
from ...protocol import legacy_tasks as lt
from ...protocol import modern_tasks as mt
from ...protocol import modern_to_legacy as m2l
from ...protocol import task_extension as te
from ...protocol.modern_validate import ModernRequest
from ...upstream.base import Reply
from ...upstream.errors import UpstreamError
from ...upstream.legacy_session import LegacyUpstreamSession, SessionPool
from ..channel import Caller
from ..scopes import TaskScope
from .host import LegacyTaskHost, TaskChannel, refusals

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_PEEK_TIMEOUT_S = 2.0  # for the status message of the server's task behind a hosted one
_TOOL_PAGES_MAX = 100  # tools/list pages walked at most to learn which tools run only as tasks


# ------------------------------------------------------------ which tools the server runs as tasks


class TaskTools:
    """What the upstream's tools/list says of tasks: the tools it runs only as tasks (taskSupport
    "required"), and those it may run as tasks (optional or required). Learnt from its tools/list
    replies, or from a walk of its list before the first tools/call of a server that takes tasks."""

    def __init__(self) -> None:
        self.required: set[str] = set()
        self.capable: set[str] = set()
        self.learnt = False

    def learn_from(self, tools_list: JSONDict) -> None:
        self.required |= m2l.task_required_tools(tools_list)
        self.capable |= m2l.task_capable_tools(tools_list)

    def as_task(self, name: object, *, hosted: bool) -> bool:
        """Whether a call of tool `name` is made task-augmented: a tool the server runs only as a
        task always is; one it may run as a task is when the call runs in a task the proxy hosts
        (the server's own task then backs the proxy's)."""
        return name in self.required or (hosted and name in self.capable)

    async def runs_as_task(self, session: LegacyUpstreamSession, upstream: str, name: object, *, hosted: bool) -> bool:
        """Whether a tools/call of tool `name` on `session` is made task-augmented, its list walked
        first if it was not yet."""
        if not m2l.runs_tool_calls_as_tasks(session.server_capabilities):
            return False
        if not self.learnt:
            await self.learn(session, upstream)
        return self.as_task(name, hosted=hosted)

    async def learn(self, session: LegacyUpstreamSession, upstream: str) -> None:
        """Walk the server's tools/list once (a client may call a tool without listing first)."""
        self.learnt = True
        cursor: Any = None
        try:
            for _ in range(_TOOL_PAGES_MAX):
                result = await session.call("tools/list", {"cursor": cursor} if cursor is not None else None)
                self.learn_from(result)
                cursor = result.get("nextCursor")
                if cursor is None:
                    return
        except (UpstreamError, ProxyError, TimeoutError) as exc:
            self.learnt = False  # tried again with the next call
            log.warning("upstream_tools_unlisted", upstream=upstream, error=str(exc))


# ------------------------------------------------------------ which requests are the extension's


class TaskRoute(enum.Enum):
    TASK_METHOD = "task method"  # tasks/get, tasks/update, tasks/cancel
    MAY_BECOME_TASK = "may become a task"  # a first tools/call of a client declaring the extension


def task_route(request: ModernRequest) -> TaskRoute | None:
    """The tasks path a request takes; None for every other request, served as it is."""
    if request.method in te.METHODS:
        return TaskRoute.TASK_METHOD  # refused there if the client did not declare the extension
    if request.method != "tools/call" or not te.declared(request.capabilities):
        return None
    # A retry (requestState) resumes a call parked for the client's own rounds: no new call.
    if "requestState" in jsonrpc.params_of(request.message):
        return None
    return TaskRoute.MAY_BECOME_TASK


class TaskedCall(Protocol):
    """What of a relay's call (relay/legacy_call.py LegacyCall) the server's task behind it needs."""

    session: LegacyUpstreamSession
    trace: dict[str, str]
    tasks: TaskScope
    upstream_task_id: str | None  # the server's task, once its answer to the call was read
    task_known: asyncio.Event  # set once that answer was read (or could not be)
    finished: bool


class TaskRelay(Protocol):
    """What ModernClientTasks needs of the relay that runs its tasks' calls."""

    @property
    def name(self) -> str: ...  # the upstream's

    @property
    def pool(self) -> SessionPool: ...

    def declared(self, request: ModernRequest) -> JSONDict:
        """The capabilities a pooled session for `request` declares upstream."""
        ...

    async def serve_hosted(
        self, request: ModernRequest, caller: Caller, *, hosted_for_s: float, hosted_task: str
    ) -> JSONDict:
        """One round of a call in a hosted task: its reply."""
        ...

    def withdraw(self, request_state: str, principal: str) -> None:
        """A parked round that no retry will resume."""
        ...

    def hosted_call(self, task_id: str) -> TaskedCall | None:
        """The call running here in hosted task `task_id` that made a task of the server's."""
        ...


class ModernClientTasks:
    """The tasks extension for modern clients of a legacy upstream: the relay asks `take` once per
    request, which serves the extension's requests and the calls that become tasks."""

    def __init__(self, host: LegacyTaskHost, tools: TaskTools, relay: TaskRelay) -> None:
        self.host = host
        self._tools = tools
        self._relay = relay

    async def take(self, request: ModernRequest, caller: Caller) -> JSONDict | None:
        """The reply to `request` if it is the extension's; None: the relay serves it as usual."""
        route = task_route(request)
        if route is TaskRoute.TASK_METHOD:
            return await self._task_request(request, caller)
        if route is TaskRoute.MAY_BECOME_TASK and await self._becomes_task(request, caller):
            return await self._create_task(request, caller)
        return None

    async def _becomes_task(self, request: ModernRequest, caller: Caller) -> bool:
        """A tools/call from a client that declares the tasks extension, of a tool the server may
        run as a task: the proxy answers with a task (the extension lets the server decide which
        calls become tasks; the server's own tool list says which take long)."""
        if not self._tools.learnt:
            relay = self._relay
            credentials = meta.without_trace(caller.credentials)
            declared = relay.declared(request)
            try:
                session = await relay.pool.acquire(
                    caller.principal, declared, request.client_info, credentials, exclusive=False
                )
            except (UpstreamError, ProxyError):
                return False  # the plain call meets the same failure, and reports it
            try:
                if m2l.runs_tool_calls_as_tasks(session.server_capabilities):
                    await self._tools.learn(session, relay.name)
            finally:
                relay.pool.release(session)
        return jsonrpc.params_of(request.message).get("name") in self._tools.capable

    async def _create_task(self, request: ModernRequest, caller: Caller) -> JSONDict:
        """The call runs in a task the proxy hosts: the handle now; each input round the call asks
        for becomes the task's `inputRequests`, answered by tasks/update."""
        message = request.message
        first = dataclasses.replace(request, message={**message, "params": lt.untasked(message)["params"]})

        async def run(channel: TaskChannel) -> JSONDict:
            current = first
            while True:
                # Each round goes with the caller's latest credentials (a refreshed token sent with
                # its tasks/get or tasks/update), as a client's own retry would.
                latest = channel.latest or caller
                reply = await self._relay.serve_hosted(
                    current, latest, hosted_for_s=channel.time_left(), hosted_task=channel.task_id
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
                    self._relay.withdraw(state, caller.principal)
                    raise
                params = {**first.message["params"], "inputResponses": answers, "requestState": state}
                current = dataclasses.replace(first, message={**first.message, "params": params})

        with refusals():
            record = await self.host.start(caller.principal, first.message, run)
        return jsonrpc.result_response(message["id"], mt.create_result(record))

    async def _with_upstream_status(self, record: lt.TaskRecord) -> lt.TaskRecord:
        """A running task as shown, with the status message of the server's own task behind it
        (a 2025-11-25 server tells its progress only in its tasks/get; server-everything's research
        says which stage it is at), when its call runs here."""
        call = self._relay.hosted_call(record.task_id)
        if call is None or call.upstream_task_id is None or call.finished:
            return record
        try:
            task = await call.session.call("tasks/get", {"taskId": call.upstream_task_id}, timeout_s=_PEEK_TIMEOUT_S)
        except (UpstreamError, ProxyError, TimeoutError) as exc:
            log.info("upstream_task_status_unread", upstream=self._relay.name, error=str(exc))
            return record
        message = task.get("statusMessage")
        return lt.told(record, message) if isinstance(message, str) else record

    async def _task_request(self, request: ModernRequest, caller: Caller) -> JSONDict:
        tasks, message, principal = self.host, request.message, caller.principal
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


# ------------------------------------------------------------ a call the server runs as a task


class TaskCall:
    """The exchange of a call the server runs as a task: the call made task-augmented, then its
    `tasks/result` read as the call's reply (its input requests arrive on that stream, as the
    2025-11-25 SDKs deliver them). What the server sends before the task exists (a question it asks
    first) is the call's like any other message; a server that answers the call at once gives the
    reply itself.

    The task-augmented call is read by a task of the call's own, to its answer even if the call is
    given up meanwhile: the task it makes is then known, and cancelled (relay/legacy_call.py
    LegacyCall._abandon waits for it; a notifications/cancelled would leave the task running)."""

    __slots__ = ("_call", "_head", "_incoming", "_outgoing", "_streams")

    def __init__(self, call: TaskedCall, outgoing: JSONDict) -> None:
        self._call = call
        self._outgoing = outgoing
        self._streams = contextlib.AsyncExitStack()
        self._head: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        # The call's messages up to its answer; None once it ended, an exception if it failed.
        self._incoming: asyncio.Queue[JSONDict | BaseException | None] = asyncio.Queue()

    async def __aenter__(self) -> Reply:
        self._call.tasks.spawn(self._create(), name="legacy-task-create")
        status, headers = await self._head
        return TaskReply(self, status, headers)

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


class TaskReply:
    """The reply of a TaskCall: the call's stream up to the task, then its tasks/result stream."""

    __slots__ = ("_exchange", "headers", "status")

    def __init__(self, exchange: TaskCall, status: int, headers: Any) -> None:
        self._exchange = exchange
        self.status = status
        self.headers = headers

    def __aiter__(self) -> AsyncGenerator[JSONDict, None]:
        return self._exchange.messages()
