#!/usr/bin/env python3
"""Legacy-era MCP test client: a scenario driver built on the PyPI package ``mcp==1.30.0``.

That SDK speaks the 2025-era protocol only (``initialize`` + ``Mcp-Session-Id``, latest
protocol version 2025-11-25). This driver connects with its Streamable HTTP client, runs
``initialize`` with a ``ClientSession`` that declares sampling, elicitation and roots
capabilities (via callbacks), runs ONE scenario and prints ONE JSON object with the raw
observations on the last line of stdout. It does not judge pass/fail.

    legacy_client.py --url URL --scenario NAME [--timeout SECONDS] [--args JSON]

A URL of the form ``stdio:{"command": ..., "args": [...], "env": {...}}`` makes the driver a stdio
host instead: it starts that command as its server process (``mcp.client.stdio.stdio_client``).

Exit status 0 after printing the observations; on any exception it prints
``{"error": "<type>: <message>", "phase": ..., "observed": {...}}`` and exits 1.

Every output object also carries these generic observations:
  scenario, sessionId, protocolVersion (from the initialize result),
  callbacks      every client callback invocation in order (sampling, elicitation,
                 list_roots, logging, progress),
  notifications  every server notification / unexpected message seen by message_handler,
  http           every HTTP exchange (method, JSON-RPC payload summary, status,
                 response content type, session/protocol headers), in response order;
                 includes the GET stream and the closing DELETE.

Run with the interpreter that has mcp 1.30.0 installed (e.g. /tmp/venv-mcp1/bin/python).
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp.types as types
from driver_cli import drive
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError
from mcp.shared.session import RequestResponder
from pydantic import AnyUrl

DEFAULT_TIMEOUT = 20.0
DEFAULT_WAIT = 5.0  # bounded wait for an expected notification (also capped by --timeout)
PROGRESS_LINE = "DRIVER-PROGRESS"  # on stderr at each progress notification (tests/support/sdk_drivers.py)
ROOTS = ["file:///tmp/root-a", "file:///tmp/root-b"]
# mcp 1.30 warns on each use of its 2025-11-25 tasks API (2026-07-28 moved tasks to an extension).
warnings.filterwarnings("ignore", "The experimental tasks API is deprecated", DeprecationWarning)


def dump(model: Any) -> Any:
    """JSON-able form of a pydantic model (or pass through plain data)."""
    if model is None:
        return None
    if hasattr(model, "model_dump"):
        return model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return model


def tool_result(result: types.CallToolResult) -> dict[str, Any]:
    return {
        "content": [dump(c) for c in result.content],
        "isError": bool(result.isError),
        "structuredContent": result.structuredContent,
    }


def describe_exc(exc: BaseException) -> str:
    if isinstance(exc, McpError):
        return f"McpError: [{exc.error.code}] {exc.error.message}"
    return f"{type(exc).__name__}: {exc}"


class Observer:
    """Collects everything the client sees; lets scenarios wait (bounded) for conditions."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args
        self.callbacks: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.http: list[dict[str, Any]] = []
        self.phase = "connect"
        self._changed = anyio.Event()

    # ---- change signalling -------------------------------------------------
    def _bump(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until predicate() is true or timeout seconds pass; return predicate()."""
        with anyio.move_on_after(timeout):
            while True:
                changed = self._changed
                if predicate():
                    return True
                await changed.wait()
        return predicate()

    # ---- ClientSession callbacks ------------------------------------------
    async def sampling(
        self, context: RequestContext[ClientSession, Any], params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.callbacks.append({"type": "sampling", "requestId": context.request_id, "params": dump(params)})
        self._bump()
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=self.args.get("sample_text", "sampled-by-client")),
            model="test-model",
            stopReason="endTurn",
        )

    async def elicitation(
        self, context: RequestContext[ClientSession, Any], params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.callbacks.append({"type": "elicitation", "requestId": context.request_id, "params": dump(params)})
        self._bump()
        if self.args.get("elicit_delay_s"):  # the user takes a while to answer
            await anyio.sleep(float(self.args["elicit_delay_s"]))
        action = self.args.get("elicit_action", "accept")
        if action == "accept":
            return types.ElicitResult(action="accept", content=self.args.get("elicit_content", {"name": "Ada"}))
        return types.ElicitResult(action=action)

    async def list_roots(self, context: RequestContext[ClientSession, Any]) -> types.ListRootsResult:
        self.callbacks.append({"type": "list_roots", "requestId": context.request_id})
        self._bump()
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in ROOTS])  # type: ignore[arg-type]

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.callbacks.append({"type": "logging", "level": params.level, "logger": params.logger, "data": params.data})
        self._bump()

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.callbacks.append({"type": "progress", "progress": progress, "total": total, "message": message})
        print(f"{PROGRESS_LINE} {progress}", file=sys.stderr, flush=True)  # the call runs: for a watching test
        self._bump()

    async def message_handler(
        self,
        message: RequestResponder[types.ServerRequest, types.ClientResult] | types.ServerNotification | Exception,
    ) -> None:
        if isinstance(message, Exception):
            self.notifications.append({"exception": describe_exc(message)})
        elif isinstance(message, types.ServerNotification):
            root = message.root
            self.notifications.append({"method": root.method, "params": dump(root.params)})
        else:  # a server request the session did not answer itself
            self.notifications.append({"unhandledRequest": message.request.root.method})
        self._bump()

    # ---- HTTP tracing (httpx event hooks) ---------------------------------
    # One entry per HTTP request, in the order requests were sent; the response hook
    # fills in status/headers when the response headers arrive (a long-lived GET stream
    # may stay at status None until the server sends its first byte).
    async def on_request(self, request: httpx.Request) -> None:
        entry: dict[str, Any] = {
            "method": request.method,
            "status": None,
            "accept": request.headers.get("accept"),
            "reqSessionId": request.headers.get("mcp-session-id"),
            "reqProtocolVersion": request.headers.get("mcp-protocol-version"),
        }
        if request.headers.get("last-event-id"):
            entry["lastEventId"] = request.headers.get("last-event-id")
        if request.method == "POST":
            try:
                body = json.loads(request.content)
                if "method" in body:
                    entry["rpc"] = body["method"]
                    if "id" in body:
                        entry["rpcId"] = body["id"]
                else:
                    entry["rpc"] = "error" if "error" in body else "result"
                    entry["rpcId"] = body.get("id")
            except Exception:
                entry["rpc"] = "?"
        request.extensions["legacy_client_trace"] = entry
        self.http.append(entry)

    async def on_response(self, response: httpx.Response) -> None:
        entry = response.request.extensions.get("legacy_client_trace")
        if entry is None:
            return
        entry["status"] = response.status_code
        entry["contentType"] = response.headers.get("content-type")
        if response.headers.get("mcp-session-id"):
            entry["respSessionId"] = response.headers.get("mcp-session-id")
        self._bump()

    def common(self) -> dict[str, Any]:
        return {"callbacks": self.callbacks, "notifications": self.notifications, "http": self.http}


# ----------------------------------------------------------------------------- scenarios
Scenario = Callable[[ClientSession, Observer, dict[str, Any], float], Awaitable[dict[str, Any]]]


async def call(session: ClientSession, obs: Observer, name: str, arguments: dict[str, Any] | None, **kw: Any):
    obs.phase = f"tools/call {name}"
    return await session.call_tool(name, arguments, **kw)


async def sc_initialize(session, obs, args, wait):  # the initialize result is recorded by run()
    return {}


async def sc_tools(session, obs, args, wait):
    obs.phase = "tools/list"
    tools = await session.list_tools()
    result = await call(session, obs, args.get("tool", "echo"), args.get("arguments", {"text": "hi"}))
    return {"tools": [t.name for t in tools.tools], "result": tool_result(result)}


async def sc_progress(session, obs, args, wait):
    result = await call(
        session, obs, args.get("tool", "progress"), args.get("arguments"), progress_callback=obs.progress
    )
    expect = int(args.get("expect_progress", 0))
    if expect:
        await obs.wait_for(lambda: sum(c["type"] == "progress" for c in obs.callbacks) >= expect, wait)
    progress = [[c["progress"], c["total"], c["message"]] for c in obs.callbacks if c["type"] == "progress"]
    return {"progress": progress, "result": tool_result(result)}


async def sc_elicitation(session, obs, args, wait):
    result = await call(session, obs, args.get("tool", "elicit"), args.get("arguments", {"message": "who?"}))
    seen = [c["params"] for c in obs.callbacks if c["type"] == "elicitation"]
    return {"elicitAction": args.get("elicit_action", "accept"), "elicitations": seen, "result": tool_result(result)}


async def sc_sampling(session, obs, args, wait):
    result = await call(session, obs, args.get("tool", "sample"), args.get("arguments", {"prompt": "hello"}))
    seen = [c["params"] for c in obs.callbacks if c["type"] == "sampling"]
    return {"samplings": seen, "result": tool_result(result)}


async def sc_roots(session, obs, args, wait):
    result = await call(session, obs, args.get("tool", "roots"), args.get("arguments"))
    calls = sum(c["type"] == "list_roots" for c in obs.callbacks)
    return {"listRootsCalls": calls, "result": tool_result(result)}


async def sc_multi(session, obs, args, wait):
    result = await call(session, obs, args.get("tool", "multi"), args.get("arguments"))
    return {"callbackTypes": [c["type"] for c in obs.callbacks], "result": tool_result(result)}


async def sc_logging(session, obs, args, wait):
    level = args.get("level", "warning")
    obs.phase = f"logging/setLevel {level}"
    set_level = await session.set_logging_level(level)
    result = await call(session, obs, args.get("tool", "log"), args.get("arguments"))
    expect = int(args.get("expect_logs", 0))
    if expect:
        await obs.wait_for(lambda: sum(c["type"] == "logging" for c in obs.callbacks) >= expect, wait)
    logs = [[c["level"], c["logger"], c["data"]] for c in obs.callbacks if c["type"] == "logging"]
    return {"level": level, "setLevelResult": dump(set_level), "logs": logs, "result": tool_result(result)}


async def sc_subscribe(session, obs, args, wait):
    uri = str(AnyUrl(args.get("uri", "test://watched")))
    trigger = args.get("trigger_tool", "touch")  # null -> only subscribe/unsubscribe
    trigger_args = args.get("trigger_arguments", {"uri": uri})
    quiet = float(args.get("quiet_window", 1.0))

    def updates() -> list[dict[str, Any]]:
        return [
            n
            for n in obs.notifications
            if n.get("method") == "notifications/resources/updated" and (n.get("params") or {}).get("uri") == uri
        ]

    out: dict[str, Any] = {"uri": uri, "triggerTool": trigger}
    obs.phase = "resources/subscribe"
    out["subscribeResult"] = dump(await session.subscribe_resource(AnyUrl(uri)))
    if trigger:
        out["triggerResult"] = tool_result(await call(session, obs, trigger, trigger_args))
        obs.phase = "wait notifications/resources/updated"
        out["updateArrived"] = await obs.wait_for(lambda: len(updates()) >= 1, wait)
    out["updates"] = [n["params"] for n in updates()]
    obs.phase = "resources/unsubscribe"
    out["unsubscribeResult"] = dump(await session.unsubscribe_resource(AnyUrl(uri)))
    if trigger:
        before = len(updates())
        out["secondTriggerResult"] = tool_result(await call(session, obs, trigger, trigger_args))
        obs.phase = f"quiet window {quiet}s after unsubscribe"
        await anyio.sleep(quiet)  # observation window, not synchronisation
        out["updateAfterUnsubscribe"] = len(updates()) > before
    else:
        out["updateArrived"] = None
        out["updateAfterUnsubscribe"] = None
    return out


async def sc_list_changed(session, obs, args, wait):
    trigger = args.get("trigger_tool", "add_tool")

    def changed() -> int:
        return sum(n.get("method") == "notifications/tools/list_changed" for n in obs.notifications)

    obs.phase = "tools/list (before)"
    before = [t.name for t in (await session.list_tools()).tools]
    out: dict[str, Any] = {"triggerTool": trigger, "toolsBefore": before}
    if trigger:
        out["triggerResult"] = tool_result(await call(session, obs, trigger, args.get("trigger_arguments", {})))
        obs.phase = "wait notifications/tools/list_changed"
        out["listChangedArrived"] = await obs.wait_for(lambda: changed() >= 1, wait)
    else:
        out["listChangedArrived"] = None
    out["listChangedCount"] = changed()
    obs.phase = "tools/list (after)"
    out["toolsAfter"] = [t.name for t in (await session.list_tools()).tools]
    return out


async def sc_prompts(session, obs, args, wait):
    obs.phase = "prompts/list"
    prompts = await session.list_prompts()
    name = args.get("prompt", "greet")
    obs.phase = f"prompts/get {name}"
    got = await session.get_prompt(name, args.get("prompt_arguments", {"name": "alice"}))
    return {
        "prompts": [p.name for p in prompts.prompts],
        "description": got.description,
        "messages": [dump(m) for m in got.messages],
    }


async def sc_completion(session, obs, args, wait):
    if args.get("resource_uri"):
        ref: Any = types.ResourceTemplateReference(type="ref/resource", uri=args["resource_uri"])
    else:
        ref = types.PromptReference(type="ref/prompt", name=args.get("prompt", "greet"))
    argument = args.get("argument", {"name": "name", "value": "al"})
    obs.phase = "completion/complete"
    res = await session.complete(ref, argument, args.get("context_arguments"))
    return {
        "ref": dump(ref),
        "argument": argument,
        "values": res.completion.values,
        "total": res.completion.total,
        "hasMore": res.completion.hasMore,
    }


async def sc_ping(session, obs, args, wait):
    results = []
    for i in range(2):
        obs.phase = f"ping #{i + 1}"
        results.append(dump(await session.send_ping()))
    return {"pings": results}


async def sc_session_end(session, obs, args, wait):
    return {}  # run() records the session id, exits the contexts, then reports the DELETE


async def sc_expiry(session, obs, args, wait):
    """Ping until the session is gone (the proxy expired it) or `args.deadline` seconds pass."""
    deadline = float(args.get("deadline", 10.0))
    ok = 0
    error = None
    with anyio.move_on_after(deadline):
        while True:
            obs.phase = f"ping #{ok + 1} (waiting for expiry)"
            try:
                await session.send_ping()
            except McpError as exc:
                error = describe_exc(exc)
                break
            ok += 1
            await anyio.sleep(float(args.get("interval", 0.2)))  # polling cadence, bounded by deadline
    return {"pingsBeforeExpiry": ok, "expiryError": error}


async def sc_resources(session, obs, args, wait):
    obs.phase = "resources/list"
    resources = await session.list_resources()
    obs.phase = "resources/templates/list"
    templates = await session.list_resource_templates()
    uri = args.get("uri", "test://static")
    obs.phase = f"resources/read {uri}"
    read = await session.read_resource(AnyUrl(uri))
    return {
        "resources": [str(r.uri) for r in resources.resources],
        "resourceTemplates": [t.uriTemplate for t in templates.resourceTemplates],
        "uri": uri,
        "contents": [dump(c) for c in read.contents],
    }


async def changed_count(count: Callable[[], Awaitable[int]], before: int, wait: float) -> int:
    """The server's count once it differs from `before` (or as it is after `wait`): polled, since
    the server's count is the only signal there is."""
    after = before
    with anyio.move_on_after(wait):
        while after == before:
            after = await count()
            if after == before:
                await anyio.sleep(0.1)
    return after


async def tool_count(session: ClientSession, obs: Observer, tool: str) -> int:
    """A count the server tells through a tool (the tool's text is the number)."""
    result = await call(session, obs, tool, {})
    return int(result.content[0].text)


async def running(session: ClientSession, obs: Observer, args: dict[str, Any], before: int | None, wait: float) -> bool:
    """Whether the call started runs upstream: by the server's `started_tool` count moving past
    `before` (for a call that reports no progress, e.g. one the server runs as a task)."""
    if before is None:
        return False
    return await changed_count(lambda: tool_count(session, obs, args["started_tool"]), before, wait) != before


async def sc_cancel(session, obs, args, wait):
    """Cancel a running call the 2025-era way: notifications/cancelled naming its id (the SDK
    sends none by itself), then stop waiting for it. The server's `check_tool` count, read before
    and (bounded) after, tells whether the server saw the call cancelled. The call is known to
    run by its first progress, or by the server's `started_tool` count when it has none."""
    check = args.get("check_tool", "cancelled_count")

    async def count() -> int:
        return await tool_count(session, obs, check)

    before = await count()
    started_before = await tool_count(session, obs, args["started_tool"]) if args.get("started_tool") else None
    progressed = anyio.Event()

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        await obs.progress(p, total, message)
        progressed.set()

    scope = anyio.CancelScope()
    request_id: list[int] = []

    async def slow() -> None:
        with scope:
            request_id.append(session._request_id)  # the id the SDK is about to give the call
            await call(session, obs, args.get("tool", "slow"), args.get("arguments"), progress_callback=on_progress)

    async with anyio.create_task_group() as group:
        group.start_soon(slow)
        if started_before is not None:
            if not await running(session, obs, args, started_before, wait):
                raise TimeoutError("the call never started upstream")
        else:
            with anyio.fail_after(wait):
                await progressed.wait()  # the call runs upstream
        params = types.CancelledNotificationParams(requestId=request_id[0], reason="the user gave up")
        await session.send_notification(types.ClientNotification(types.CancelledNotification(params=params)))
        scope.cancel()
    after = await changed_count(count, before, wait)
    return {"checkBefore": before, "checkAfter": after, "cancelledId": request_id[0]}


# ---- tasks (2025-11-25): session.experimental, the SDK's requestor side of tasks ----------------
TASK_PROGRESS = "task-progress"  # the progressToken a task's call carries (its progress comes as notifications)


async def attempt(what: Awaitable[Any]) -> dict[str, Any]:
    """{"ok": result} or {"error": {code, message}} of one SDK call."""
    try:
        return {"ok": dump(await what)}
    except McpError as exc:
        return {"error": {"code": exc.error.code, "message": exc.error.message}}


async def create_task(session: ClientSession, obs: Observer, args: dict[str, Any], tool: str, arguments: Any):
    obs.phase = f"tools/call {tool} as a task"
    return await session.experimental.call_tool_as_task(
        args.get("tool", tool),
        args.get("arguments", arguments),
        ttl=int(args.get("ttl", 60000)),
        meta={"progressToken": TASK_PROGRESS},
    )


def task_progress(obs: Observer) -> list[dict[str, Any]]:
    return [
        n["params"]
        for n in obs.notifications
        if n.get("method") == "notifications/progress" and n["params"].get("progressToken") == TASK_PROGRESS
    ]


async def sc_task(session, obs, args, wait):
    """A task: created, polled with poll_task (up to the end, or to input_required, which the
    SDK does not stop at), then its result with the blocking get_task_result (where input
    requests arrive, answered by the session's callbacks; a JSON-RPC error is `resultError`)."""
    created = await create_task(session, obs, args, "echo", {"text": "as a task"})
    task_id = created.task.taskId
    statuses = []
    obs.phase = "poll_task"
    async for status in session.experimental.poll_task(task_id):
        statuses.append(dump(status))
        if status.status == "input_required":
            break
    obs.phase = "tasks/result"
    result, result_error = None, None
    try:
        result = await session.experimental.get_task_result(task_id, types.CallToolResult)
    except McpError as exc:  # a task that ended in a JSON-RPC error: tasks/result answers that error
        result_error = {"code": exc.error.code, "message": exc.error.message}
    obs.phase = "tasks/get (after)"
    after = await session.experimental.get_task(task_id)

    def told_the_end() -> bool:  # the status notifications come on the GET stream, unordered with the result
        return any(
            n.get("method") == "notifications/tasks/status"
            and n["params"]["taskId"] == task_id
            and n["params"]["status"] in ("completed", "failed", "cancelled")
            for n in obs.notifications
        )

    obs.phase = "wait for the final notifications/tasks/status"
    await obs.wait_for(told_the_end, wait)
    return {
        "created": dump(created),
        "statuses": statuses,
        "result": dump(result),
        **({"resultError": result_error} if result_error else {}),
        "after": dump(after),
        "progress": task_progress(obs),
        "elicitations": [c["params"] for c in obs.callbacks if c["type"] == "elicitation"],
    }


async def sc_task_cancel(session, obs, args, wait):
    """Cancel a running task with cancel_task (twice); a tasks/result waiting meanwhile, and the
    server's `check_tool` count (bounded poll) show how it ended."""
    check = args.get("check_tool", "cancelled_count")

    async def count() -> int:
        result = await call(session, obs, check, {})
        return int(result.content[0].text)

    before = await count()
    started_before = await tool_count(session, obs, args["started_tool"]) if args.get("started_tool") else None
    created = await create_task(session, obs, args, "slow", {"seconds": 10})
    task_id = created.task.taskId
    out: dict[str, Any] = {"checkBefore": before, "taskId": task_id}

    async def pending() -> None:
        out["pendingResult"] = await attempt(session.experimental.get_task_result(task_id, types.CallToolResult))

    async with anyio.create_task_group() as group:
        group.start_soon(pending)  # the stream the call's progress comes on
        obs.phase = "wait for the task's progress (it runs upstream)"
        if started_before is not None:
            out["progressed"] = await running(session, obs, args, started_before, wait)
        else:
            out["progressed"] = await obs.wait_for(lambda: bool(task_progress(obs)), wait)
        obs.phase = "tasks/cancel"
        out["cancel"] = await attempt(session.experimental.cancel_task(task_id))
        out["cancelAgain"] = await attempt(session.experimental.cancel_task(task_id))
    out["afterCancel"] = await attempt(session.experimental.get_task(task_id))
    after = await changed_count(count, before, wait)
    out["checkAfter"] = after
    return out


async def sc_task_unknown(session, obs, args, wait):
    task_id = args.get("task_id", "no-such-task")
    obs.phase = "tasks/* on an unknown id"
    return {
        "getTask": await attempt(session.experimental.get_task(task_id)),
        "getTaskResult": await attempt(session.experimental.get_task_result(task_id, types.CallToolResult)),
        "cancelTask": await attempt(session.experimental.cancel_task(task_id)),
    }


async def sc_task_expiry(session, obs, args, wait):
    """A task with a short ttl: its result, then get_task polled (bounded by `deadline`) until refused."""
    created = await create_task(session, obs, args, "echo", {"text": "short-lived"})
    task_id = created.task.taskId
    result = await attempt(session.experimental.get_task_result(task_id, types.CallToolResult))
    seen: dict[str, Any] = {}
    with anyio.move_on_after(float(args.get("deadline", 10.0))):
        while True:
            seen = await attempt(session.experimental.get_task(task_id))
            if "error" in seen:
                break
            await anyio.sleep(0.05)  # polling cadence, bounded by the deadline
    return {"created": dump(created), "result": result, "expired": seen}


async def sc_task_list(session, obs, args, wait):
    created = []
    for i in range(int(args.get("count", 2))):
        created.append((await create_task(session, obs, {}, "echo", {"text": f"listed {i}"})).task.taskId)
    obs.phase = "tasks/list"
    return {"created": created, "listed": dump(await session.experimental.list_tasks())}


async def sc_task_create(session, obs, args, wait):
    """One task, followed until it ended; run() then ends the session (DELETE)."""
    created = await create_task(session, obs, args, "echo", {"text": "kept"})
    statuses = [dump(s) for s in [s async for s in session.experimental.poll_task(created.task.taskId)]]
    return {"taskId": created.task.taskId, "statuses": statuses}


async def sc_task_read(session, obs, args, wait):
    task_id = args["task_id"]
    return {
        "getTask": await attempt(session.experimental.get_task(task_id)),
        "getTaskResult": await attempt(session.experimental.get_task_result(task_id, types.CallToolResult)),
        "listed": await attempt(session.experimental.list_tasks()),
    }


SCENARIOS: dict[str, Scenario] = {
    "cancel": sc_cancel,
    "initialize": sc_initialize,
    "tools": sc_tools,
    "progress": sc_progress,
    "elicitation": sc_elicitation,
    "sampling": sc_sampling,
    "roots": sc_roots,
    "multi": sc_multi,
    "logging": sc_logging,
    "subscribe": sc_subscribe,
    "list_changed": sc_list_changed,
    "prompts": sc_prompts,
    "completion": sc_completion,
    "ping": sc_ping,
    "session_end": sc_session_end,
    "resources": sc_resources,
    "expiry": sc_expiry,
    "task": sc_task,
    "task_cancel": sc_task_cancel,
    "task_unknown": sc_task_unknown,
    "task_expiry": sc_task_expiry,
    "task_list": sc_task_list,
    "task_create": sc_task_create,
    "task_read": sc_task_read,
}


# ----------------------------------------------------------------------------- driver
STDIO_PREFIX = "stdio:"
SSE_PREFIX = "sse:"


def stdio_errlog(spec: dict[str, Any]) -> Any:
    """Where the server process's stderr goes: the spec's `errlog` file, or this driver's stderr."""
    return open(spec["errlog"], "a") if spec.get("errlog") else sys.stderr


@asynccontextmanager
async def transport(url: str, http_client: httpx.AsyncClient) -> AsyncIterator[Any]:
    """Streamable HTTP to `url`, HTTP+SSE to the stream URL after `sse:`, or the stdio server
    process a `stdio:{json}` URL describes."""
    if url.startswith(STDIO_PREFIX):
        spec = json.loads(url[len(STDIO_PREFIX) :])
        params = StdioServerParameters(
            command=spec["command"], args=spec.get("args", []), env=spec.get("env"), cwd=spec.get("cwd")
        )
        errlog = stdio_errlog(spec)
        async with stdio_client(params, errlog=errlog) as (read, write):
            yield read, write, lambda: None
        return
    if url.startswith(SSE_PREFIX):  # the 2024-11-05 HTTP+SSE transport: GET the stream, POST its endpoint
        session_ids: list[str] = []

        def same_client(headers: Any = None, timeout: Any = None, auth: Any = None) -> httpx.AsyncClient:
            # sse_client opens and closes the client itself: one like the observed one (same hooks).
            return httpx.AsyncClient(
                headers={**http_client.headers, **(headers or {})},
                timeout=timeout or http_client.timeout,
                auth=auth,
                event_hooks=http_client.event_hooks,
            )

        async with sse_client(
            url[len(SSE_PREFIX) :], httpx_client_factory=same_client, on_session_created=session_ids.append
        ) as (read, write):
            yield read, write, lambda: session_ids[-1] if session_ids else None
        return
    async with streamable_http_client(url, http_client=http_client) as streams:
        yield streams


async def run(url: str, scenario: str, args: dict[str, Any], timeout: float, obs: Observer, out: dict[str, Any]):
    wait = min(float(args.get("wait", DEFAULT_WAIT)), timeout)
    with anyio.fail_after(timeout):
        http_client = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, read=300.0),  # the SDK's defaults; --timeout bounds the run
            headers=args.get("headers") or None,  # sent on every request (e.g. a W3C traceparent)
            event_hooks={"request": [obs.on_request], "response": [obs.on_response]},
        )
        async with http_client:
            async with transport(url, http_client) as (read, write, get_session_id):
                async with ClientSession(
                    read,
                    write,
                    sampling_callback=obs.sampling,
                    elicitation_callback=obs.elicitation,
                    list_roots_callback=obs.list_roots,
                    logging_callback=obs.logging,
                    message_handler=obs.message_handler,
                    client_info=types.Implementation(name="legacy-client-peer", version="1.30.0"),
                ) as session:
                    obs.phase = "initialize"
                    init = await session.initialize()
                    out["sessionId"] = get_session_id()
                    out["protocolVersion"] = init.protocolVersion
                    if scenario == "initialize":
                        out["serverInfo"] = dump(init.serverInfo)
                        out["capabilities"] = dump(init.capabilities)
                        out["instructions"] = init.instructions
                    out.update(await SCENARIOS[scenario](session, obs, args, wait))
                    obs.phase = "closing session"
                obs.phase = "closing transport (DELETE)"
            obs.phase = "closed"

        # After a clean exit the transport has sent DELETE (if it had a session id).
        deletes = [h for h in obs.http if h["method"] == "DELETE"]
        out["deleteStatus"] = deletes[-1]["status"] if deletes else None
        if scenario == "session_end" and args.get("probe") and out.get("sessionId"):
            obs.phase = "probe old session"
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as probe_client:
                resp = await probe_client.post(
                    url,
                    json={"jsonrpc": "2.0", "id": "probe", "method": "ping"},
                    headers={
                        "accept": "application/json, text/event-stream",
                        "mcp-session-id": out["sessionId"],
                        "mcp-protocol-version": out["protocolVersion"],
                    },
                )
                out["probeAfterDelete"] = {"status": resp.status_code, "body": resp.text[:500]}


def main() -> int:
    return drive(
        __doc__,
        SCENARIOS,
        DEFAULT_TIMEOUT,
        Observer,
        run,
        describe=describe_exc,
        observed=lambda scenario, obs: obs.common(),
    )


if __name__ == "__main__":
    sys.exit(main())
