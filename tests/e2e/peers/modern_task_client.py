#!/usr/bin/env python3
"""Modern-era MCP tasks client: a scenario driver built on the PyPI package ``mcp==2.3.0`` that
speaks the ``io.modelcontextprotocol/tasks`` extension through the SDK's own extension hooks.

mcp 2.3 implements no tasks itself; it has the hooks an extension needs, and this driver is that
extension: a ``ClientExtension`` (declared in every request's client capabilities by the SDK) whose
``ResultClaim(result_type="task")`` takes the task handle a ``tools/call`` may get and resolves it
by polling; ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` are custom ``Request`` models sent
with ``ClientSession.send_request`` (their ClassVar ``name_param = "taskId"`` makes the SDK send
``Mcp-Name``); a ``NotificationBinding`` takes ``notifications/tasks``. ``Client.listen()`` has a
fixed filter (no ``taskIds``), so the ``listen`` scenario sends the SDK's own
``SubscriptionsListenRequest`` through ``send_request``, its filter carrying ``taskIds`` as the
extension key the model admits. Same conventions as modern_client.py (whose Observer, HTTP tracing
and helpers it uses): ONE scenario, ONE JSON object on the last line of stdout, no pass/fail.

    modern_task_client.py --url URL --scenario NAME [--timeout SECONDS] [--args JSON]

Exit status 0 after printing the observations; on any exception it prints
``{"error": "<type>: <message>", "phase": ..., "observed": {...}}`` and exits 1.

Every output object carries modern_client.py's generic observations (protocolVersion,
connectedVia, callbacks, notifications, http) and ``wire``: per POST, the JSON-RPC method, the
``Mcp-Name`` header sent, the extensions its client capabilities declared, the HTTP status and
every JSON-RPC message of the response body in full (for schema checks).

Scenarios (args with defaults) and their specific output keys:
  task      (tool=simulate-research-query, arguments={"topic":"tides"}, elicit_content, extension=true)
            ``Client.call_tool``: the claim's resolver polls tasks/get until the task ends,
            answers each input round's elicitations with tasks/update. handle, polls (status,
            statusMessage, inputRequests keys/methods per tasks/get), updates (sent, ack),
            result (the resolved CallToolResult), claimed (was the handle claimed)
  plain     (tool, arguments, task_id="no-such-task") a client WITHOUT the extension: result; then
            tasks/get (getError, getStatus)
  cancel    (tool, arguments) ``session.call_tool(allow_claimed=True)``: handle; polls until the
            task runs; cancel (ack), cancelAgain (ack); after (tasks/get statuses until terminal)
  unknown   (task_id="no-such-task") tasks/get, tasks/update, tasks/cancel of an id never issued:
            errors {method: {code, message, data}}, statuses {method: HTTP status}
  listen    (tool, arguments) handle; subscriptions/listen with notifications.taskIds=[handle];
            ack (the acknowledged filter), taskNotifications (what the NotificationBinding got)
  expire    (tool, arguments) handle; polls tasks/get until it errors: polls, goneError, goneAfterS

Common args: mode (default "2026-07-28"; "auto" probes server/discover, falls back to initialize),
poll_ms (a cap on the task's pollIntervalMs, which is honoured by default), elicit_action /
elicit_content (the answers).

Run with the interpreter that has mcp 2.3.0 installed
(~/.cache/mcp-era-proxy/venvs/mcp2/bin/python).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
from driver_cli import drive
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from modern_client import (
    MODERN_VERSION,
    Observer,
    describe_exc,
    dump,
    error_json,
    parse_sse,
    tool_result,
)
from pydantic import ConfigDict
from pydantic.alias_generators import to_camel

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

EXTENSION = "io.modelcontextprotocol/tasks"
DEFAULT_TIMEOUT = 30.0
TOOL = "simulate-research-query"
TERMINAL = ("completed", "failed", "cancelled")
OPEN = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")  # unknown fields kept


# ----------------------------------------------------------------------------- the extension's wire
class TaskParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any]


class GetTaskRequest(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"  # the extension's routing header (Mcp-Name: <taskId>)


class UpdateTaskRequest(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class TaskHandle(types.Result):
    """CreateTaskResult: what a tools/call may get instead of its result."""

    model_config = OPEN
    result_type: Literal["task"]
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    status_message: str | None = None


class DetailedTask(types.Result):
    """GetTaskResult (and, without resultType, the params of notifications/tasks)."""

    model_config = OPEN
    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class Ack(types.Result):
    """UpdateTaskResult / CancelTaskResult: an empty acknowledgement."""

    model_config = OPEN
    result_type: str | None = None


class TaskNotificationParams(types.NotificationParams):
    model_config = OPEN
    task_id: str
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- the client extension
class Tasks(ClientExtension):
    """The tasks extension for this driver: claims task handles, resolves them by polling, and
    records what it saw (statuses, input rounds, notifications)."""

    identifier = EXTENSION

    def __init__(self, obs: Observer, args: dict[str, Any]) -> None:
        self.obs = obs
        self.args = args
        self.handles: list[dict[str, Any]] = []
        self.polls: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [
            NotificationBinding(method="notifications/tasks", params_type=TaskNotificationParams, handler=self.note)
        ]

    async def note(self, params: TaskNotificationParams) -> None:
        self.notes.append(dump(params))
        self.obs.bump()

    def interval(self, task: TaskHandle | DetailedTask) -> float:
        """The task's own poll interval (the extension's SHOULD), unless `poll_ms` caps it."""
        interval = task.poll_interval_ms if task.poll_interval_ms is not None else 1000
        cap = self.args.get("poll_ms")
        return min(interval, int(cap)) / 1000 if cap is not None else interval / 1000

    async def get(self, session: ClientSession, task_id: str) -> DetailedTask:
        self.obs.phase = f"tasks/get {task_id}"
        task = await session.send_request(GetTaskRequest(params=TaskParams(task_id=task_id)), DetailedTask)
        self.polls.append(
            {
                "status": task.status,
                "statusMessage": task.status_message,
                "inputRequests": {k: v.get("method") for k, v in (task.input_requests or {}).items()},
            }
        )
        return task

    async def until(
        self, session: ClientSession, handle: TaskHandle, done: Callable[[DetailedTask], bool]
    ) -> DetailedTask:
        """tasks/get, at the task's poll interval (capped), until `done` (bounded by --timeout)."""
        while True:
            task = await self.get(session, handle.task_id)
            if done(task):
                return task
            await anyio.sleep(self.interval(task))

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The client's answer to one input request (elicitations only: that is what it declares)."""
        self.obs.callbacks.append({"type": "elicitation", "params": request.get("params")})
        action = self.args.get("elicit_action", "accept")
        if action == "accept":
            return {"action": "accept", "content": self.args.get("elicit_content", {"interpretation": "snake"})}
        return {"action": action}

    async def update(self, session: ClientSession, task_id: str, responses: dict[str, Any]) -> None:
        self.obs.phase = f"tasks/update {task_id}"
        request = UpdateTaskRequest(params=UpdateTaskParams(task_id=task_id, input_responses=responses))
        ack = await session.send_request(request, Ack)
        self.updates.append({"sent": sorted(responses), "ack": dump(ack)})

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        """Poll to the end, answering input rounds; the task's result is the call's."""
        self.handles.append(dump(handle))
        answered: set[str] = set()
        while True:
            task = await self.until(ctx.session, handle, lambda t: t.status in TERMINAL or t.status == "input_required")
            if task.status == "input_required":
                # The same keys stay in tasks/get until the task took the answer: answer each once.
                fresh = {k: v for k, v in (task.input_requests or {}).items() if k not in answered}
                if fresh:
                    await self.update(ctx.session, handle.task_id, {k: self.answer(v) for k, v in fresh.items()})
                    answered |= set(fresh)
                await anyio.sleep(self.interval(task))
                continue
            if task.status == "completed" and task.result is not None:
                return types.CallToolResult.model_validate(task.result)
            raise MCPError(**(task.error or {"code": types.INTERNAL_ERROR, "message": f"task {task.status}"}))


# ----------------------------------------------------------------------------- wire record
class TaskObserver(Observer):
    """modern_client.py's Observer, also noting the extensions each POSTed request declared."""

    async def on_request(self, request: httpx2.Request) -> None:
        await super().on_request(request)
        entry = request.extensions.get("modern_client_trace")
        if entry is None or request.method != "POST":
            return
        try:
            body = json.loads(request.content)
        except ValueError:
            return
        meta = ((body.get("params") or {}).get("_meta") or {}) if isinstance(body, dict) else {}
        capabilities = meta.get(types.CLIENT_CAPABILITIES_META_KEY)
        if isinstance(capabilities, dict):
            entry["reqExtensions"] = capabilities.get("extensions")


def wire(obs: Observer) -> list[dict[str, Any]]:
    """Every POST and the JSON-RPC messages of its response, in full."""
    out = []
    for entry in obs.http:
        if entry.get("method") != "POST":
            continue
        body = bytes(entry.get("_body") or b"")
        messages: list[Any] = []
        if body and (entry.get("contentType") or "").startswith("text/event-stream"):
            messages = [ev["data"] for ev in parse_sse(body) if isinstance(ev.get("data"), dict)]
        elif body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            messages = parsed if isinstance(parsed, list) else [parsed] if isinstance(parsed, dict) else []
        out.append(
            {
                "rpc": entry.get("rpc"),
                "rpcId": entry.get("rpcId"),
                "reqMcpName": entry.get("reqMcpName"),
                "reqExtensions": entry.get("reqExtensions"),
                "status": entry.get("status"),
                "messages": messages,
            }
        )
    return out


def statuses(obs: Observer, rpc: str) -> list[int | None]:
    return [e.get("status") for e in obs.http if e.get("rpc") == rpc]


async def attempt(action: Awaitable[Any]) -> dict[str, Any]:
    """The result of a request, or its JSON-RPC error."""
    try:
        return {"result": dump(await action)}
    except MCPError as exc:
        return {"error": error_json(exc)}


# ----------------------------------------------------------------------------- scenarios
Scenario = Callable[[Client, Observer, Tasks, dict[str, Any]], Awaitable[dict[str, Any]]]


def call_args(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return args.get("tool", TOOL), args.get("arguments", {"topic": "tides"})


async def claimed_handle(client: Client, obs: Observer, tasks: Tasks, args: dict[str, Any]) -> TaskHandle:
    """A tools/call whose claimed result the scenario handles itself."""
    name, arguments = call_args(args)
    obs.phase = f"tools/call {name} (allow_claimed)"
    result = await client.session.call_tool(name, arguments, allow_claimed=True)
    if not isinstance(result, TaskHandle):
        raise RuntimeError(f"expected a task handle, got {type(result).__name__}: {dump(result)}")
    tasks.handles.append(dump(result))
    return result


async def sc_task(client, obs, tasks, args):
    name, arguments = call_args(args)
    obs.phase = f"tools/call {name}"
    result = await client.call_tool(name, arguments)
    return {
        "claimed": bool(tasks.handles),
        "handle": tasks.handles[0] if tasks.handles else None,
        "polls": tasks.polls,
        "updates": tasks.updates,
        "result": tool_result(result),
    }


async def sc_plain(client, obs, tasks, args):
    name, arguments = call_args(args)
    obs.phase = f"tools/call {name} (no extension)"
    result = await client.call_tool(name, arguments)
    obs.phase = "tasks/get (no extension)"
    got = await attempt(
        client.session.send_request(
            GetTaskRequest(params=TaskParams(task_id=args.get("task_id", "no-such-task"))), DetailedTask
        )
    )
    return {
        "result": tool_result(result),
        "getError": got.get("error"),
        "getStatus": statuses(obs, "tasks/get")[-1],
    }


async def sc_cancel(client, obs, tasks, args):
    handle = await claimed_handle(client, obs, tasks, args)
    session = client.session
    running = None
    if args.get("poll_first", True):  # else cancelled at once, while the proxy may still be creating it upstream
        running = await tasks.until(session, handle, lambda t: t.status == "working" or t.status in TERMINAL)
    obs.phase = "tasks/cancel"
    cancel = await attempt(session.send_request(CancelTaskRequest(params=TaskParams(task_id=handle.task_id)), Ack))
    obs.phase = "tasks/cancel (again)"
    again = await attempt(session.send_request(CancelTaskRequest(params=TaskParams(task_id=handle.task_id)), Ack))
    before = len(tasks.polls)
    ended = await tasks.until(session, handle, lambda t: t.status in TERMINAL)
    return {
        "handle": dump(handle),
        "runningBeforeCancel": running.status if running is not None else None,
        "cancel": cancel,
        "cancelAgain": again,
        "after": [p["status"] for p in tasks.polls[before:]],
        "final": dump(ended),
    }


async def sc_unknown(client, obs, tasks, args):
    session = client.session
    task_id = args.get("task_id", "no-such-task")
    requests = {
        "tasks/get": (GetTaskRequest(params=TaskParams(task_id=task_id)), DetailedTask),
        "tasks/update": (UpdateTaskRequest(params=UpdateTaskParams(task_id=task_id, input_responses={})), Ack),
        "tasks/cancel": (CancelTaskRequest(params=TaskParams(task_id=task_id)), Ack),
    }
    errors: dict[str, Any] = {}
    for method, (request, result_type) in requests.items():
        obs.phase = method
        errors[method] = (await attempt(session.send_request(request, result_type))).get("error")
    return {"taskId": task_id, "errors": errors, "statuses": {m: statuses(obs, m)[-1] for m in requests}}


async def sc_listen(client, obs, tasks, args):
    handle = await claimed_handle(client, obs, tasks, args)
    session = client.session
    flt = types.SubscriptionFilter.model_validate({"taskIds": [handle.task_id]})  # the extension's key
    request = types.SubscriptionsListenRequest(params=types.SubscriptionsListenRequestParams(notifications=flt))
    out: dict[str, Any] = {"handle": dump(handle)}

    def acked() -> dict[str, Any] | None:
        for note in obs.notifications:
            if note.get("method") == "notifications/subscriptions/acknowledged":
                return note["params"]
        return None

    async with anyio.create_task_group() as group:

        async def hold() -> None:  # the listen's own result comes only when its stream ends
            out["listenResult"] = await attempt(session.send_request(request, types.SubscriptionsListenResult))
            obs.bump()

        group.start_soon(hold)
        obs.phase = "subscriptions/listen (ack)"
        await obs.wait_for(lambda: acked() is not None or "listenResult" in out, float(args.get("wait", 10)))
        out["ack"] = acked()
        obs.phase = "notifications/tasks (to the end)"
        await obs.wait_for(
            lambda: any(n["status"] in TERMINAL for n in tasks.notes) or "listenResult" in out,
            float(args.get("wait", 10)),
        )
        group.cancel_scope.cancel()
    out["taskNotifications"] = tasks.notes
    return out


async def sc_expire(client, obs, tasks, args):
    handle = await claimed_handle(client, obs, tasks, args)
    start = time.monotonic()
    try:
        await tasks.until(client.session, handle, lambda t: False)
    except MCPError as exc:
        return {
            "handle": dump(handle),
            "polls": [p["status"] for p in tasks.polls],
            "goneError": error_json(exc),
            "goneAfterS": round(time.monotonic() - start, 2),
        }
    raise AssertionError("unreachable")


SCENARIOS: dict[str, Scenario] = {
    "task": sc_task,
    "plain": sc_plain,
    "cancel": sc_cancel,
    "unknown": sc_unknown,
    "listen": sc_listen,
    "expire": sc_expire,
}


# ----------------------------------------------------------------------------- driver
async def run(url: str, scenario: str, args: dict[str, Any], timeout: float, obs: Observer, out: dict[str, Any]):
    tasks = Tasks(obs, args)
    with anyio.fail_after(timeout):
        mode = args.get("mode", MODERN_VERSION)
        out["mode"] = mode
        http_client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"request": [obs.on_request], "response": [obs.on_response]},
        )
        async with http_client:
            client = Client(
                streamable_http_client(url, http_client=http_client),
                mode=mode,
                elicitation_callback=obs.elicitation,
                message_handler=obs.message_handler,
                client_info=types.Implementation(name="modern-task-client-peer", version="2.3.0"),
                extensions=[tasks] if args.get("extension", scenario != "plain") else None,
                cache=None,
            )
            obs.phase = f"connect (mode={mode})"
            async with client:
                out["protocolVersion"] = client.protocol_version
                session = client.session
                if session.initialize_result is not None:
                    out["connectedVia"] = "initialize"
                elif any(h.get("rpc") == "server/discover" for h in obs.http):
                    out["connectedVia"] = "server/discover"
                else:
                    out["connectedVia"] = "adopted"
                out.update(await SCENARIOS[scenario](client, obs, tasks, args))
                obs.phase = "closing client"
            obs.phase = "closed"


def main() -> int:
    return drive(
        __doc__,
        SCENARIOS,
        DEFAULT_TIMEOUT,
        TaskObserver,
        run,
        describe=describe_exc,
        observed=lambda scenario, obs: {**obs.common(), "wire": wire(obs)},
        error_data=lambda leaf: error_json(leaf) if isinstance(leaf, MCPError) else None,
    )


if __name__ == "__main__":
    sys.exit(main())
