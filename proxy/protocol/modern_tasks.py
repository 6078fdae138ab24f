"""Tasks the proxy hosts for 2026-07-28 clients that declare the `io.modelcontextprotocol/tasks`
extension: the shapes they see of a task record, as pure functions.

In 2026-07-28 tasks are the extension's (the io.modelcontextprotocol/tasks extension,
specification/draft/tasks.md): a client declares it in each request's client capabilities, a server
may answer a `tools/call` with a task handle (`resultType: "task"`), and the client polls
`tasks/get` (the result, the error or the outstanding `inputRequests` inline), answers input with
`tasks/update` and cancels with `tasks/cancel`; there is no `tasks/result` and no `tasks/list`.
A 2025-11-25 server has its own, session-bound tasks with another wire, so the proxy hosts the task
itself (the same records as for 2025-11-25 clients, protocol.legacy_tasks.TaskRecord) and runs the
call through the ordinary translation, its input rounds becoming the task's `inputRequests`
(docs/design.md §Tasks).
"""

from __future__ import annotations

from typing import Any

from . import jsonrpc, meta
from .legacy_tasks import TaskRecord, TaskRefused, iso_time
from .task_extension import EXTENSION

JSONDict = dict[str, Any]
# What a request that needs the extension gets without it: -32021 with the capability it needs
# (specification/draft/tasks.md, "Error Handling"; HTTP 400, 2026-07-28 schema).
MISSING_MESSAGE = "Missing required client capability"
MISSING_DATA: JSONDict = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


def missing_extension() -> TaskRefused:
    return TaskRefused(jsonrpc.MISSING_REQUIRED_CAPABILITY, MISSING_MESSAGE, MISSING_DATA)


def advertise(discover_result: JSONDict) -> JSONDict:
    """server/discover with the extension among the server's capabilities (empty settings)."""
    capabilities = jsonrpc.obj(discover_result.get("capabilities"))
    extensions = {**jsonrpc.obj(capabilities.get("extensions")), EXTENSION: {}}
    return {**discover_result, "capabilities": {**capabilities, "extensions": extensions}}


def status(record: TaskRecord) -> str:
    """The extension's status: `failed` is for a JSON-RPC error only; a tool result with `isError`
    is `completed` (2025-11-25 called that `failed`, and the record keeps that revision's status)."""
    if record.status == "failed" and record.reply is not None and isinstance(record.reply.get("result"), dict):
        return "completed"
    return record.status


def _task(record: TaskRecord) -> JSONDict:
    task: JSONDict = {
        "taskId": record.task_id,
        "status": status(record),
        "createdAt": iso_time(record.created_at),
        "lastUpdatedAt": iso_time(record.updated_at),
        "ttlMs": record.ttl_ms,
        "pollIntervalMs": record.poll_interval_ms,
    }
    if record.status_message is not None:
        task["statusMessage"] = record.status_message
    return task


def create_result(record: TaskRecord) -> JSONDict:
    """The `tools/call` answer: the task handle (CreateTaskResult, flat, no result inline)."""
    return {"resultType": "task", **_task(record)}


def detailed(record: TaskRecord) -> JSONDict:
    """The DetailedTask `tasks/get` answers and `notifications/tasks` carries: the outstanding
    input requests, the result or the error inline."""
    task = _task(record)
    shown = task["status"]
    reply = record.reply or {}
    if shown == "input_required" and record.input_requests:
        task["inputRequests"] = record.input_requests
    elif shown == "completed" and isinstance(reply.get("result"), dict):
        result = dict(reply["result"])
        result_meta = jsonrpc.obj(result.get("_meta"))
        if meta.RELATED_TASK in result_meta:  # the inlined result carries no related-task
            rest = {k: v for k, v in result_meta.items() if k != meta.RELATED_TASK}
            if rest:
                result["_meta"] = rest
            else:
                result.pop("_meta")
        task["result"] = result
    elif shown == "failed" and isinstance(reply.get("error"), dict):
        task["error"] = reply["error"]
    return task


def get_result(record: TaskRecord) -> JSONDict:
    return {"resultType": "complete", **detailed(record)}


def ack() -> JSONDict:
    """`tasks/update` and `tasks/cancel` answer with an empty result (eventually consistent)."""
    return {"resultType": "complete"}


def notification(record: TaskRecord, subscription_id: Any) -> JSONDict:
    """`notifications/tasks` on a listen stream that asked for the task, tagged with it."""
    params = {**detailed(record), "_meta": {meta.SUBSCRIPTION_ID: subscription_id}}
    return jsonrpc.notification("notifications/tasks", params)


def input_responses(message: JSONDict) -> JSONDict:
    """`tasks/update`'s `inputResponses`: a map of input request keys to the client's answers.

    Raises TaskRefused (-32602) for anything else."""
    responses = jsonrpc.params_of(message).get("inputResponses")
    if not isinstance(responses, dict) or not all(isinstance(v, dict) for v in responses.values()):
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "tasks/update needs params.inputResponses (an object of answers)")
    return responses


def listened_task_ids(notifications: JSONDict) -> list[str]:
    """The `taskIds` a subscriptions/listen filter asks for. Raises TaskRefused (-32602) for a
    value that is not a list of task ids."""
    ids = notifications.get("taskIds")
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise TaskRefused(jsonrpc.INVALID_PARAMS, "notifications.taskIds must be a list of task ids")
    return list(dict.fromkeys(ids))
