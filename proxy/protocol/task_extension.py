"""The `io.modelcontextprotocol/tasks` extension of 2026-07-28: its identifier, the Task shapes on
its wire and the requests that drive one, as constants and pure functions.

Spec: io.modelcontextprotocol/tasks extension (specification/draft/tasks.md). A client opts in per
request (`_meta["io.modelcontextprotocol/clientCapabilities"].extensions`), a server that has
the extension says so in `server/discover` (`capabilities.extensions`) and may then answer a
`tools/call` with a flat `CreateTaskResult` (`resultType: "task"`); the client polls `tasks/get`
(the task with its `result`, `error` or `inputRequests` inline), answers input with
`tasks/update {taskId, inputResponses}` and gives up with `tasks/cancel`. Each of the three goes
with `Mcp-Name: <taskId>` over Streamable HTTP.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from . import jsonrpc
from .headers import METHOD_HEADER, NAME_HEADER, PROTOCOL_VERSION_HEADER, encode_header_value

JSONDict = dict[str, Any]
Status = Literal["working", "input_required", "completed", "failed", "cancelled"]

EXTENSION = "io.modelcontextprotocol/tasks"
RESULT_TYPE = "task"  # the CreateTaskResult discriminator the extension reserves
STATUSES: frozenset[str] = frozenset({"working", "input_required", "completed", "failed", "cancelled"})
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
TASK_METHODS = frozenset({"tools/call"})  # the requests a server may answer with a task ("Supported Methods")
# How often a task is polled at most and at least, whatever the server suggests: a pollIntervalMs
# of 0 must not become a busy loop, a huge one must not leave a waiting client without news.
MIN_POLL_MS = 50
MAX_POLL_MS = 30_000


def declared(capabilities: object) -> bool:
    """Whether a capabilities object (ServerCapabilities or ClientCapabilities) has the extension."""
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def with_extension(capabilities: JSONDict) -> JSONDict:
    """Client capabilities that also declare the extension (an empty settings object)."""
    extensions = capabilities.get("extensions")
    extensions = dict(extensions) if isinstance(extensions, dict) else {}
    extensions.setdefault(EXTENSION, {})
    return {**capabilities, "extensions": extensions}


def is_task_result(result: object) -> bool:
    return isinstance(result, dict) and result.get("resultType") == RESULT_TYPE


@dataclass(frozen=True, slots=True)
class TaskView:
    """One Task as the server last described it (a CreateTaskResult or a tasks/get result)."""

    task_id: str
    status: Status
    status_message: str | None
    ttl_ms: int | None
    poll_interval_ms: int | None
    result: JSONDict | None = None  # completed
    error: JSONDict | None = None  # failed
    input_requests: JSONDict | None = None  # input_required


class InvalidTask(ValueError):
    """A task the server described against the extension's schema."""


def parse_task(value: object, *, created: bool = False) -> TaskView:
    """Read a CreateTaskResult (`created`) or a GetTaskResult; raises InvalidTask with the reason."""
    if not isinstance(value, dict):
        raise InvalidTask("the task is not an object")
    task_id = value.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidTask("taskId is missing or not a string")
    status = value.get("status")
    if status not in STATUSES:
        raise InvalidTask(f"unknown task status {status!r}")
    ttl = value.get("ttlMs")
    if ttl is not None and not _non_negative_int(ttl):
        raise InvalidTask("ttlMs is not a non-negative integer or null")
    poll = value.get("pollIntervalMs")
    if poll is not None and not _non_negative_int(poll):
        raise InvalidTask("pollIntervalMs is not a non-negative integer")
    message = value.get("statusMessage")
    view = TaskView(task_id, status, message if isinstance(message, str) else None, ttl, poll)
    if created:
        return view  # a CreateTaskResult inlines nothing
    if status == "completed":
        result = value.get("result")
        if not isinstance(result, dict):
            raise InvalidTask("a completed task carries no result object")
        return TaskView(view.task_id, status, view.status_message, ttl, poll, result=result)
    if status == "failed":
        error = value.get("error")
        if not jsonrpc.is_error_object(error):
            raise InvalidTask("a failed task carries no JSON-RPC error")
        assert isinstance(error, dict)
        return TaskView(view.task_id, status, view.status_message, ttl, poll, error=error)
    if status == "input_required":
        requests = value.get("inputRequests")
        if not isinstance(requests, dict):
            raise InvalidTask("an input_required task carries no inputRequests object")
        return TaskView(view.task_id, status, view.status_message, ttl, poll, input_requests=requests)
    return view


def _non_negative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def short_id(task_id: str) -> str:
    """What logs show instead of an upstream task id (a bearer token of the task's state)."""
    return hashlib.sha256(task_id.encode()).hexdigest()[:12]


def poll_delay_s(suggested_ms: int | None, default_ms: int) -> float:
    """Seconds until the next tasks/get: the server's pollIntervalMs (its SHOULD), else the
    proxy's own interval, kept within [MIN_POLL_MS, MAX_POLL_MS]."""
    wanted = suggested_ms if suggested_ms is not None else default_ms
    return min(max(wanted, MIN_POLL_MS), MAX_POLL_MS) / 1000


def request(
    method: str,
    request_id: jsonrpc.RequestId,
    task_id: str,
    request_meta: JSONDict,
    input_responses: JSONDict | None = None,
) -> JSONDict:
    """A tasks/get, tasks/update or tasks/cancel for `task_id`, with the request `_meta` (which
    must declare the extension, else the server answers -32021)."""
    params: JSONDict = {"taskId": task_id, "_meta": request_meta}
    if input_responses is not None:
        params["inputResponses"] = input_responses
    return jsonrpc.request(request_id, method, params)


def headers(method: str, task_id: str, modern_version: str) -> dict[str, str]:
    """The request-metadata headers of a tasks/* request: `Mcp-Name` is the task id ("Streamable
    HTTP: Routing Headers")."""
    out = {PROTOCOL_VERSION_HEADER: modern_version, METHOD_HEADER: method}
    name = encode_header_value(task_id)
    if name is not None:
        out[NAME_HEADER] = name
    return out


def cancelled_error() -> JSONDict:
    """What a legacy client gets for a call whose upstream task ended `cancelled`: an error, since
    the call has no result (a legacy request has no "cancelled" outcome once it is answered)."""
    return jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "the upstream cancelled the task running this call")


def gone_error(error: JSONDict) -> JSONDict:
    """The call's error when the upstream no longer knows its task (-32602 on tasks/get: expired,
    or never known): the upstream's error in `data`, so nothing of it is lost."""
    return jsonrpc.error_object(
        jsonrpc.INTERNAL_ERROR,
        f"the upstream no longer knows the task running this call (expired?): {error.get('message')}",
        {"upstreamError": error},
    )
