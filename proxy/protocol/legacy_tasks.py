"""Tasks the proxy hosts for legacy (2025-11-25) clients: the record of one task and the shapes
the client sees, as plain data and pure functions.

A 2025-11-25 client may augment `tools/call` with `params.task` and gets a `CreateTaskResult` at
once; it then polls `tasks/get`, blocks on `tasks/result`, cancels with `tasks/cancel` and pages
through `tasks/list` (2025-11-25/basic/utilities/tasks.mdx). A 2026-07-28 server knows none of
this (tasks moved to the `io.modelcontextprotocol/tasks` extension, with another wire), so the proxy
runs the call upstream itself and keeps the task: this module says what each of those methods
answers given the record; the relay (relay.legacy_tasks) runs the call and keeps the records in the
task store (docs/design.md §Tasks).

Records are keyed by the caller's principal and the task id, never by session: a task outlives
the session that made it, and another caller's id is simply not found. Times are epoch seconds,
given by the caller (the core reads no clock).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from . import jsonrpc, meta
from .versions import legacy_at_least

JSONDict = dict[str, Any]
Status = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/cancel", "tasks/list"})
TASKS_SINCE = "2025-11-25"  # the first revision with tasks
# What the proxy declares to a 2025-11-25 client (ServerCapabilities.tasks): it lists and cancels
# tasks and runs tools/call as one.
SERVER_CAPABILITY: JSONDict = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
NOT_FOUND = "Failed to retrieve task: Task not found"
CANCELLED_MESSAGE = "The task was cancelled by request."
_RECORD_VERSION = 1


class TaskRefused(Exception):
    """A task request the proxy answers with a JSON-RPC error (the relay raises it as such)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


@dataclass(frozen=True, slots=True)
class Policy:
    """The `tasks` settings the core needs: retention and the poll interval it advertises."""

    default_ttl_ms: int
    max_ttl_ms: int
    poll_interval_ms: int
    page_size: int


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task: what the store keeps, the same on every replica."""

    task_id: str
    principal: str
    tool: str
    status: Status
    created_at: float
    updated_at: float
    ttl_ms: int
    poll_interval_ms: int
    status_message: str | None = None
    reply: JSONDict | None = None  # the call's final JSON-RPC reply (result or error) once it ended
    owner: str = ""  # the replica running the call ("" = this one, alone)
    # While `input_required`, for a 2026-07-28 client: the input requests not answered yet (key ->
    # {method, params}); 2025-11-25 clients get them as requests on a tasks/result stream instead.
    input_requests: JSONDict | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def expires_at(self) -> float:
        return self.created_at + self.ttl_ms / 1000

    def encode(self) -> bytes:
        return orjson.dumps({"v": _RECORD_VERSION, **asdict(self)})

    @classmethod
    def decode(cls, data: bytes) -> TaskRecord | None:
        """The record, or None for bytes this version does not read (a record of a newer one)."""
        try:
            fields = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(fields, dict) or fields.pop("v", None) != _RECORD_VERSION:
            return None
        # Fields a later version added are left out, so replicas of both versions read each
        # other's records during a rolling upgrade.
        known = {k: v for k, v in fields.items() if k in _FIELDS}
        try:
            return cls(**known)
        except TypeError:
            return None


_FIELDS = frozenset(TaskRecord.__dataclass_fields__)


# ---------------------------------------------------------------- creating a task


def supports_tasks(legacy_version: str) -> bool:
    return legacy_at_least(legacy_version, TASKS_SINCE)


def requested_ttl_ms(params: JSONDict) -> int | None:
    """`params.task` of a task-augmented request: the retention it asks for (None: none asked).

    Raises TaskRefused for a `task` that is not a TaskMetadata object."""
    task = params.get("task")
    if not isinstance(task, dict):
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "params.task must be an object (TaskMetadata)")
    ttl = task.get("ttl")
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl < 0:
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "params.task.ttl must be a non-negative number of milliseconds")
    return int(ttl)


def is_task_request(message: JSONDict) -> bool:
    """A `tools/call` the client asked to run as a task."""
    params = message.get("params")
    return message.get("method") == "tools/call" and isinstance(params, dict) and "task" in params


def untasked(message: JSONDict) -> JSONDict:
    """The call as it runs upstream: the same request without `params.task` (a 2026-07-28 server
    would ignore it; it is the proxy's to honour)."""
    params = {k: v for k, v in message["params"].items() if k != "task"}
    return {**message, "params": params}


def new_task(
    task_id: str, principal: str, message: JSONDict, now: float, policy: Policy, owner: str = ""
) -> TaskRecord:
    """The record of a task just created for `message` (a task-augmented tools/call). The retention
    is what the client asked for, at most `max_ttl_ms`; the default when it asked for none (or
    cannot: a 2026-07-28 client's call has no `task`)."""
    params = message["params"]
    asked = requested_ttl_ms(params) if "task" in params else None
    ttl = policy.default_ttl_ms if asked is None else min(asked, policy.max_ttl_ms)
    name = params.get("name")
    return TaskRecord(
        task_id=task_id,
        principal=principal,
        tool=name if isinstance(name, str) else "",
        status="working",
        created_at=now,
        updated_at=now,
        ttl_ms=ttl,
        poll_interval_ms=policy.poll_interval_ms,
        owner=owner,
    )


# ---------------------------------------------------------------- what the client sees


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_object(record: TaskRecord) -> JSONDict:
    """The 2025-11-25 `Task` (tasks/get, tasks/cancel, tasks/list, notifications/tasks/status)."""
    task: JSONDict = {
        "taskId": record.task_id,
        "status": record.status,
        "createdAt": iso_time(record.created_at),
        "lastUpdatedAt": iso_time(record.updated_at),
        "ttl": record.ttl_ms,
        "pollInterval": record.poll_interval_ms,
    }
    if record.status_message is not None:
        task["statusMessage"] = record.status_message
    return task


def create_task_result(record: TaskRecord) -> JSONDict:
    return {"task": task_object(record)}


def status_notification(record: TaskRecord) -> JSONDict:
    return jsonrpc.notification("notifications/tasks/status", task_object(record))


def related(message: JSONDict, task_id: str) -> JSONDict:
    """A message sent for the task (an input request, a notification): tagged with the task it
    belongs to in `_meta` (2025-11-25 tasks.mdx, "Associating Task-Related Messages")."""
    params = jsonrpc.obj(message.get("params"))
    tagged = {**jsonrpc.obj(params.get("_meta")), meta.RELATED_TASK: {"taskId": task_id}}
    return {**message, "params": {**params, "_meta": tagged}}


def result_reply(record: TaskRecord, request_id: jsonrpc.RequestId) -> JSONDict:
    """`tasks/result` for a task that ended: exactly what the call would have answered (its result
    or its error), the result tagged with its task. A cancelled task has no result."""
    reply = record.reply
    if record.status == "cancelled" or reply is None:
        raise TaskRefused(
            jsonrpc.INVALID_PARAMS,
            f"Task was {record.status}: it has no result",
            {"taskId": record.task_id, "status": record.status},
        )
    if "error" in reply:
        return {"jsonrpc": "2.0", "id": request_id, "error": reply["error"]}
    result = jsonrpc.obj(reply.get("result"))
    tagged = {**jsonrpc.obj(result.get("_meta")), meta.RELATED_TASK: {"taskId": record.task_id}}
    return jsonrpc.result_response(request_id, {**result, "_meta": tagged})


# ---------------------------------------------------------------- changes


def asked(record: TaskRecord, now: float, requests: JSONDict | None = None) -> TaskRecord:
    """The call needs the client's input: `input_required` until it is answered. `requests`: the
    input requests still outstanding, for a client that reads them in tasks/get."""
    if record.terminal or (record.status == "input_required" and record.input_requests == requests):
        return record
    return replace(record, status="input_required", input_requests=requests, updated_at=now)


def answered(record: TaskRecord, now: float) -> TaskRecord:
    if record.status != "input_required":
        return record
    return replace(record, status="working", input_requests=None, updated_at=now)


def finished(record: TaskRecord, reply: JSONDict, now: float) -> TaskRecord:
    """The call's final reply: `completed`, or `failed` for an error and for a tool result with
    `isError` (2025-11-25: "this includes cases where the tool call result has isError set")."""
    if record.terminal:  # cancelled first: a result arriving afterwards changes nothing
        return record
    result = reply.get("result")
    if "error" in reply or not isinstance(result, dict):
        given = reply.get("error")
        error: JSONDict = (
            given
            if isinstance(given, dict) and jsonrpc.is_error_object(given)
            else jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "the call ended without a result or an error")
        )  # kept as an answer tasks/result can give
        failure = {"jsonrpc": "2.0", "id": reply.get("id"), "error": error}
        return replace(
            record, status="failed", status_message=error["message"], reply=failure, input_requests=None, updated_at=now
        )
    status: Status = "failed" if result.get("isError") is True else "completed"
    return replace(record, status=status, reply=reply, input_requests=None, updated_at=now)


def told(record: TaskRecord, status_message: str) -> TaskRecord:
    """A running task as shown with what the work behind it says of itself (not kept: the next
    look asks again)."""
    if record.terminal:
        return record
    return replace(record, status_message=status_message)


def cancelled(record: TaskRecord, now: float) -> TaskRecord:
    """`tasks/cancel`: the task is `cancelled` before the answer; a task that ended cannot be."""
    if record.terminal:
        raise TaskRefused(jsonrpc.INVALID_PARAMS, f"Cannot cancel task: already in terminal status '{record.status}'")
    return replace(record, status="cancelled", status_message=CANCELLED_MESSAGE, input_requests=None, updated_at=now)


def lost(record: TaskRecord, reason: str, now: float) -> TaskRecord:
    """The call cannot go on (the proxy shut down, the replica running it is gone)."""
    if record.terminal:
        return record
    reply = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, reason, {"reason": "task_lost"})
    return replace(record, status="failed", status_message=reason, reply=reply, input_requests=None, updated_at=now)


# ---------------------------------------------------------------- requests about tasks


def task_id_of(message: JSONDict) -> str:
    task_id = jsonrpc.params_of(message).get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise TaskRefused(jsonrpc.INVALID_PARAMS, f"{message['method']} needs params.taskId (a string)")
    return task_id


def visible(record: TaskRecord | None, principal: str, now: float) -> TaskRecord:
    """The caller's own live task, or the error for an unknown, foreign or expired id (the same
    for all three: whether another caller's task exists is not the caller's to learn)."""
    if record is None or record.principal != principal or now >= record.expires_at:
        raise TaskRefused(jsonrpc.INVALID_PARAMS, NOT_FOUND)
    return record


def encode_cursor(record: TaskRecord) -> str:
    position = orjson.dumps([record.created_at, record.task_id])
    return base64.urlsafe_b64encode(position).rstrip(b"=").decode()


def decode_cursor(cursor: object) -> tuple[float, str]:
    """Where a tasks/list page starts: after (created_at, task_id). -32602 for a cursor the proxy
    did not give."""
    if not isinstance(cursor, str):
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "Invalid cursor")
    try:
        position = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "Invalid cursor") from None
    if (
        not isinstance(position, list)
        or len(position) != 2
        or not isinstance(position[0], (int, float))
        or not isinstance(position[1], str)
    ):
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "Invalid cursor")
    return float(position[0]), position[1]


def list_result(records: list[TaskRecord], page_size: int) -> JSONDict:
    """One tasks/list page from the caller's records after the cursor, oldest first (`records` may
    hold one more than a page: then there is a next one)."""
    page = records[:page_size]
    result: JSONDict = {"tasks": [task_object(r) for r in page]}
    if len(records) > page_size and page:
        result["nextCursor"] = encode_cursor(page[-1])
    return result


# ---------------------------------------------------------------- what a 2025-11-25 client is told


def advertise(capabilities: JSONDict, legacy_version: str) -> JSONDict:
    """The initialize result's capabilities with the proxy's task support, for clients of a
    revision that has tasks (whatever the upstream said of tasks is the proxy's to say here)."""
    if not supports_tasks(legacy_version):
        return capabilities
    return {**capabilities, "tasks": SERVER_CAPABILITY}


def mark_tools(result: JSONDict, legacy_version: str) -> JSONDict:
    """A tools/list page for a client with tasks: every tool may run as one (`taskSupport:
    optional`), since the proxy hosts the task whatever the tool; a tool's own `execution` stays."""
    tools = result.get("tools")
    if not supports_tasks(legacy_version) or not isinstance(tools, list):
        return result
    marked = [
        {**tool, "execution": {"taskSupport": "optional"}}
        if isinstance(tool, dict) and "execution" not in tool
        else tool
        for tool in tools
    ]
    return {**result, "tools": marked}
