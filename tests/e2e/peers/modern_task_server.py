"""A 2026-07-28 server that runs tools as tasks of the `io.modelcontextprotocol/tasks` extension,
built on the `mcp==2.3.0` SDK (no pinned peer implements the extension: this is the project's own).

The SDK's extension hooks carry it: `server/discover` advertises the extension
(`capabilities.extensions`), `Extension.methods()` serves `tasks/get`, `tasks/update` and
`tasks/cancel`, and `intercept_tool_call` answers a call of a task tool with a
`CreateTaskResult` (`resultType: "task"`) when, and only when, the request declared the
extension in `_meta["io.modelcontextprotocol/clientCapabilities"].extensions`; otherwise the
tool runs as the plain call it is (io.modelcontextprotocol/tasks extension
(specification/draft/tasks.md), "Capability Negotiation").

Task tools (each also callable plainly):

* ``slow_task(seconds)``: completes after ``seconds`` with "slow done after <seconds>s".
* ``ask_task()``: asks one form elicitation (``inputRequests`` key ``name``), then completes
  with "hello <name>" from the ``tasks/update`` answer.
* ``failing_task()``: fails with the JSON-RPC error -32603 "the job blew up".
* ``short_lived_task()``: a task with ``ttlMs`` 300 that never finishes: past its TTL it is
  forgotten, and ``tasks/get`` answers -32602 "Failed to retrieve task: Task not found".

Plain tools ``created_count()`` and ``cancel_count()`` return those two counts as text;
``task_counts()`` returns JSON ``{"created", "cancels", "cancelled", "gets",
"updates", "name_mismatches"}``: tasks created, ``tasks/cancel`` requests received, tasks that
ended ``cancelled`` because of one, ``tasks/get`` and ``tasks/update`` requests served, and
task requests refused for a missing or wrong ``Mcp-Name`` header (-32020, which the extension's
"Streamable HTTP: Routing Headers" section requires).

Tasks run in the server process, in memory. Run with the mcp 2.3.0 virtualenv::

    python tests/e2e/peers/modern_task_server.py --port 0 [--poll-interval-ms 100]

Prints ``READY http://127.0.0.1:PORT/mcp`` (flushed) once listening; logs on stderr; exits on
SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

import uvicorn  # noqa: E402
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext  # noqa: E402
from mcp.server.extension import Extension, MethodBinding  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.server import require_client_extension  # noqa: E402
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError  # noqa: E402
from mcp_types import CallToolRequestParams, RequestParams  # noqa: E402

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

TASKS = "io.modelcontextprotocol/tasks"
HOST = "127.0.0.1"
PATH = "/mcp"
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
TASK_TOOLS = ("slow_task", "ask_task", "failing_task", "short_lived_task")
TTL_MS = 60_000
SHORT_TTL_MS = 300
TERMINAL = ("completed", "failed", "cancelled")
NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}

COUNTS = {"created": 0, "cancels": 0, "cancelled": 0, "gets": 0, "updates": 0, "name_mismatches": 0}
POLL_INTERVAL_MS = {"value": 100}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Task:
    task_id: str
    ttl_ms: int
    created: float = field(default_factory=time.monotonic)
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)
    status: str = "working"
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] = field(default_factory=dict)
    answers: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    worker: asyncio.Task[None] | None = None

    def expired(self) -> bool:
        return time.monotonic() - self.created > self.ttl_ms / 1000

    def set(self, status: str, **fields: Any) -> None:
        if self.status in TERMINAL:
            return  # terminal states never change
        self.status = status
        self.updated_at = _now()
        for name, value in fields.items():
            setattr(self, name, value)

    def wire(self) -> dict[str, Any]:
        """The Task as the extension's schema has it (flat, `ttlMs`/`pollIntervalMs`)."""
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.updated_at,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": POLL_INTERVAL_MS["value"],
        }
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        return out

    def detailed(self) -> dict[str, Any]:
        out = self.wire()
        if self.status == "input_required":
            out["inputRequests"] = dict(self.input_requests)
        elif self.status == "completed":
            out["result"] = self.result
        elif self.status == "failed":
            out["error"] = self.error
        return out


_tasks: dict[str, _Task] = {}


def _text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


async def _work(task: _Task, tool: str, arguments: dict[str, Any]) -> None:
    try:
        if tool == "slow_task":
            seconds = float(arguments.get("seconds", 1.0))
            await asyncio.sleep(seconds)
            task.set("completed", result=_text_result(f"slow done after {seconds:g}s"))
        elif tool == "ask_task":
            request = {
                "method": "elicitation/create",
                "params": {"mode": "form", "message": "What is your name?", "requestedSchema": NAME_SCHEMA},
            }
            task.set("input_required", input_requests={"name": request}, status_message="waiting for a name")
            answer = await task.answers.get()
            task.input_requests = {}
            task.set("working", status_message=None)
            content = answer.get("content") if isinstance(answer, dict) else None
            name = content.get("name") if isinstance(content, dict) else None
            task.set("completed", result=_text_result(f"hello {name} ({answer.get('action')})"))
        elif tool == "failing_task":
            await asyncio.sleep(0.1)
            error = {"code": INTERNAL_ERROR, "message": "the job blew up"}
            task.set("failed", error=error, status_message="Tool execution failed: the job blew up")
        else:  # short_lived_task: never ends by itself
            await asyncio.Event().wait()
    except asyncio.CancelledError:
        COUNTS["cancelled"] += 1
        task.set("cancelled", status_message="The task was cancelled by request.")
        raise


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    try:
        require_client_extension(ctx, TASKS)
    except MCPError:
        return False
    return True


def _check_name(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return
    if headers.get("mcp-name") != task_id:
        COUNTS["name_mismatches"] += 1
        raise MCPError(HEADER_MISMATCH, "Mcp-Name header does not match params.taskId")


def _find(task_id: str) -> _Task:
    task = _tasks.get(task_id)
    if task is not None and task.expired():
        if task.worker is not None:
            task.worker.cancel()
        del _tasks[task_id]
        task = None
    if task is None:
        raise MCPError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
    return task


class TaskParams(RequestParams):
    taskId: str  # the wire name


class UpdateParams(TaskParams):
    inputResponses: dict[str, Any]  # the wire name


async def _get(ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
    require_client_extension(ctx, TASKS)
    _check_name(ctx, params.taskId)
    COUNTS["gets"] += 1
    return {"resultType": "complete", **_find(params.taskId).detailed()}


async def _update(ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> HandlerResult:
    require_client_extension(ctx, TASKS)
    _check_name(ctx, params.taskId)
    COUNTS["updates"] += 1
    task = _find(params.taskId)
    for key, answer in params.inputResponses.items():
        if key in task.input_requests:  # keys not outstanding are ignored
            task.input_requests.pop(key)
            task.answers.put_nowait(answer)
    return {"resultType": "complete"}


async def _cancel(ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
    require_client_extension(ctx, TASKS)
    _check_name(ctx, params.taskId)
    COUNTS["cancels"] += 1
    task = _find(params.taskId)
    if task.status not in TERMINAL and task.worker is not None:
        task.worker.cancel()
    return {"resultType": "complete"}  # an empty ack, on a terminal task too


class TasksExtension(Extension):
    identifier = TASKS

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, _get),  # type: ignore[arg-type]
            MethodBinding("tasks/update", UpdateParams, _update),  # type: ignore[arg-type]
            MethodBinding("tasks/cancel", TaskParams, _cancel),  # type: ignore[arg-type]
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS or not _declared(ctx):
            return await call_next(ctx)
        ttl = SHORT_TTL_MS if params.name == "short_lived_task" else TTL_MS
        task = _Task(secrets.token_urlsafe(18), ttl, status_message="The operation is now in progress.")
        _tasks[task.task_id] = task
        task.worker = asyncio.get_running_loop().create_task(_work(task, params.name, dict(params.arguments or {})))
        COUNTS["created"] += 1
        return {"resultType": "task", **task.wire()}  # durable before it is returned: _tasks holds it


mcp: MCPServer = MCPServer("modern-task-e2e-server", version="1.0.0", extensions=[TasksExtension()])


@mcp.tool(
    description="Complete after `seconds` (a task when the client declares the extension).", structured_output=False
)
async def slow_task(seconds: float = 1.0) -> str:
    await asyncio.sleep(seconds)
    return f"slow done after {seconds:g}s"


@mcp.tool(
    description="Ask for a name, then greet (a task when the client declares the extension).", structured_output=False
)
async def ask_task() -> str:
    return "hello (no task: nobody was asked)"


@mcp.tool(
    description="Fail with a JSON-RPC error (a task when the client declares the extension).", structured_output=False
)
async def failing_task() -> str:
    raise MCPError(INTERNAL_ERROR, "the job blew up")


@mcp.tool(description="A task with a tiny ttlMs that never finishes.", structured_output=False)
async def short_lived_task() -> str:
    return "short-lived (no task)"


@mcp.tool(description="What the task machinery saw so far, as JSON.", structured_output=False)
def task_counts() -> str:
    return json.dumps(COUNTS)


@mcp.tool(description="Tasks created so far.", structured_output=False)
def created_count() -> str:
    return str(COUNTS["created"])


@mcp.tool(description="tasks/cancel requests received so far.", structured_output=False)
def cancel_count() -> str:
    return str(COUNTS["cancels"])


async def _serve(port: int) -> None:
    app = mcp.streamable_http_app(
        streamable_http_path=PATH,
        host=HOST,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    config = uvicorn.Config(
        app, host=HOST, port=port, log_config=None, log_level="warning", access_log=False, timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        actual = next(sock.getsockname()[1] for srv in server.servers for sock in srv.sockets)
        print(f"READY http://{HOST}:{actual}{PATH}", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve()
    finally:
        announcer.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="2026-07-28 server with io.modelcontextprotocol/tasks")
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    parser.add_argument("--poll-interval-ms", type=int, default=100, help="pollIntervalMs of every task")
    args = parser.parse_args(argv)
    POLL_INTERVAL_MS["value"] = args.poll_interval_ms
    try:
        asyncio.run(_serve(args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
