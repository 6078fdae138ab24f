"""Modern client → legacy upstream: the request half and the reply half, as pure functions.

The proxy keeps pooled legacy sessions upstream and presents a stateless 2026-07-28 server
downstream. Server-to-client requests of the legacy server become `input_required` results.
docs/translation.md §4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import jsonrpc, meta
from .capabilities import (
    describe_required,
    legacy_client_capabilities,
    missing_input_capability,
    modern_server_capabilities,
)
from .methods import HINTED_METHODS, INPUT_REQUEST_METHODS, INPUT_REQUIRED_METHODS, LIST_CHANGED, uri_within
from .status import http_status
from .versions import LATEST_LEGACY, LEGACY_VERSIONS, MODERN_VERSIONS, Era

JSONDict = dict[str, Any]

# Keys of the request `_meta` and params that only the proxy may consume.
# `task` is 2025-11-25's task augmentation, which a 2026-07-28 server ignores: a legacy server
# would take it as one (the proxy asks for a task itself where it wants one).
_CONSUMED_PARAMS = frozenset({"inputResponses", "requestState", "task"})
# What of a request `_meta` stays with the proxy: the envelope, and the client's progress token
# (the upstream gets the proxy's own).
_STRIPPED_META = frozenset({*meta.ENVELOPE_KEYS, "progressToken"})
# Codes 2026-07-28 reserves (-32020..-32099) but does not define, which it forbids emitting.
_MODERN_DEFINED = frozenset(
    {jsonrpc.HEADER_MISMATCH, jsonrpc.MISSING_REQUIRED_CAPABILITY, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION}
)


@dataclass(frozen=True, slots=True)
class CacheHint:
    ttl_ms: int
    scope: str  # "private" | "public"


# ---------------------------------------------------------------- session opening


def initialize_request(request_id: jsonrpc.RequestId, modern_caps: JSONDict, client_info: JSONDict) -> JSONDict:
    return jsonrpc.request(
        request_id,
        "initialize",
        {
            "protocolVersion": LATEST_LEGACY,
            "capabilities": legacy_client_capabilities(modern_caps),
            "clientInfo": client_info,
        },
    )


class InitializeRejected(ValueError):
    """The legacy server answered initialize with something we cannot use."""


def check_initialize_result(result: object) -> JSONDict:
    if not isinstance(result, dict) or result.get("protocolVersion") not in LEGACY_VERSIONS:
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        raise InitializeRejected(f"upstream negotiated an unsupported protocol version {version!r}")
    return result


def discover_result(initialize: JSONDict, hint: CacheHint) -> JSONDict:
    """server/discover answered from a legacy InitializeResult (docs/translation.md §4.2)."""
    result: JSONDict = {
        "resultType": "complete",
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": modern_server_capabilities(initialize.get("capabilities")),
    }
    if isinstance(initialize.get("instructions"), str):
        result["instructions"] = initialize["instructions"]
    if isinstance(initialize.get("serverInfo"), dict):
        result["_meta"] = {meta.SERVER_INFO: initialize["serverInfo"]}
    result["ttlMs"] = hint.ttl_ms
    result["cacheScope"] = hint.scope
    return result


# ---------------------------------------------------------------- request half


def notification_to_upstream(message: JSONDict) -> JSONDict:
    """A modern client's notification for a legacy session, its envelope stripped as a request's."""
    return {k: v for k, v in to_upstream(message, 0).items() if k != "id"}


def to_upstream(message: JSONDict, upstream_id: jsonrpc.RequestId, progress_token: Any = None) -> JSONDict:
    """Strip the modern envelope; the legacy session already carries version and capabilities."""
    params = message.get("params")
    if not isinstance(params, dict):
        params = {}
    elif _CONSUMED_PARAMS.isdisjoint(params):  # the usual request: a plain copy, no key tested twice
        params = dict(params)
    else:
        params = {k: v for k, v in params.items() if k not in _CONSUMED_PARAMS}
    request_meta = params.get("_meta")
    if isinstance(request_meta, dict):
        if request_meta.keys() <= _STRIPPED_META:  # the envelope alone, as most requests send it
            rest = {}
        else:
            rest = {k: v for k, v in request_meta.items() if k not in _STRIPPED_META}
        if progress_token is not None:
            rest["progressToken"] = progress_token
        if rest:
            params["_meta"] = rest
        else:
            del params["_meta"]
    out = dict(message)
    out["id"] = upstream_id
    if params:
        out["params"] = params
    else:
        out.pop("params", None)
    return out


def progress_token_of(message: JSONDict) -> Any:
    params = message.get("params")
    return progress_token_in(params) if isinstance(params, dict) else None


def progress_token_in(params: JSONDict) -> Any:
    """The progress token of a request whose params object is `params`."""
    request_meta = params.get("_meta")
    return request_meta.get("progressToken") if isinstance(request_meta, dict) else None


# ---------------------------------------------------------------- reply half


def result_to_downstream(
    method: str, result: JSONDict, server_info: JSONDict | None, hint: CacheHint | None
) -> JSONDict:
    out = dict(result)
    out["resultType"] = "complete"
    if method == "tools/list" and isinstance(out.get("tools"), list):
        out["tools"] = [
            {k: v for k, v in tool.items() if k != "execution"} if isinstance(tool, dict) else tool
            for tool in out["tools"]
        ]
    if method in HINTED_METHODS and hint is not None:
        out["ttlMs"] = hint.ttl_ms
        out["cacheScope"] = hint.scope
    if server_info is not None:
        result_meta = out.get("_meta")
        out["_meta"] = (
            {**result_meta, meta.SERVER_INFO: server_info}
            if isinstance(result_meta, dict)
            else {meta.SERVER_INFO: server_info}
        )
    return out


def error_to_downstream(error: JSONDict) -> tuple[JSONDict, int]:
    """A legacy error as 2026-07-28 defines it, with the HTTP status to send it with."""
    code = error.get("code")
    if code == jsonrpc.RESOURCE_NOT_FOUND:
        error = {**error, "code": jsonrpc.INVALID_PARAMS}
    elif isinstance(code, int) and -32099 <= code <= -32020 and code not in _MODERN_DEFINED:
        error = jsonrpc.error_object(
            jsonrpc.INTERNAL_ERROR, str(error.get("message", "upstream error")), {"upstreamError": error}
        )
    return error, http_status(error.get("code"), Era.MODERN)


def notification_to_downstream(note: JSONDict, progress_token: Any, log_level: str | None) -> JSONDict | None:
    """A request-scoped notification from the legacy session, for one modern request."""
    method = note.get("method")
    params = jsonrpc.params_of(note)
    if method == "notifications/message":
        return note if meta.level_passes(params.get("level"), log_level) else None
    if method == "notifications/progress":
        if progress_token is None:
            return None
        return {**note, "params": {**params, "progressToken": progress_token}}
    return None  # nothing else is request-scoped in 2026-07-28


# ---------------------------------------------------------------- server-to-client requests


@dataclass(frozen=True, slots=True)
class Park:
    """Hold the upstream call; surface this as an `inputRequests` entry."""

    input_request: JSONDict


@dataclass(frozen=True, slots=True)
class Missing:
    """The server needs a capability this request did not declare: like a modern server, fail the
    request with -32021 naming it (and refuse the server's request upstream)."""

    required: JSONDict
    upstream_error: JSONDict


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the upstream at once with this JSON-RPC result or error object."""

    result: JSONDict | None = None
    error: JSONDict | None = None

    def response(self, request_id: Any) -> JSONDict:
        """The JSON-RPC response to the server's request `request_id`."""
        if self.error is not None:
            return {"jsonrpc": "2.0", "id": request_id, "error": self.error}
        return jsonrpc.result_response(request_id, self.result or {})


def server_request(
    request: JSONDict, downstream_method: str | None, downstream_caps: JSONDict
) -> Park | Answer | Missing:
    """What to do with a legacy server's request S during the downstream request F
    (docs/translation.md §4.5)."""
    method = request.get("method")
    if method == "ping":
        return Answer(result={})
    if not isinstance(method, str) or method not in INPUT_REQUEST_METHODS:  # any JSON value, unhashable too
        return Answer(error=jsonrpc.error_object(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}"))
    if downstream_method not in INPUT_REQUIRED_METHODS:
        return Answer(
            error=jsonrpc.error_object(
                jsonrpc.METHOD_NOT_FOUND, f"{method} is not available during {downstream_method or 'this call'}"
            )
        )
    params = jsonrpc.params_of(request)
    required = missing_input_capability(method, params, downstream_caps)
    if required is not None:
        # Legacy servers expect invalid params for an elicitation the client cannot do, else not found.
        code = jsonrpc.INVALID_PARAMS if method == "elicitation/create" else jsonrpc.METHOD_NOT_FOUND
        return Missing(
            required, jsonrpc.error_object(code, f"the client did not declare {describe_required(required)}")
        )
    clean = {k: v for k, v in params.items() if k not in ("task", "_meta")}
    if method == "elicitation/create":
        clean.pop("elicitationId", None)
    entry: JSONDict = {"method": method}
    if clean or method != "roots/list":
        entry["params"] = clean
    return Park(entry)


def abandoned_answer(method: str) -> Answer:
    """How a parked server request is answered when the client never comes back."""
    if method == "elicitation/create":
        return Answer(result={"action": "cancel"})
    return Answer(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "the client did not answer"))


# ---------------------------------------------------------------- subscriptions


def honored_filter(requested: JSONDict, server_caps: JSONDict, push_channel: bool, subscribed: list[str]) -> JSONDict:
    """The part of a listen filter the legacy server can deliver (docs/translation.md §4.6 step 5)."""
    honored: JSONDict = {}
    if not push_channel:
        return honored
    for key, (kind, _) in LIST_CHANGED.items():
        entry = server_caps.get(kind)
        if requested.get(key) is True and isinstance(entry, dict) and entry.get("listChanged"):
            honored[key] = True
    if subscribed:
        honored["resourceSubscriptions"] = subscribed
    return honored


def listen_notification(note: JSONDict, honored: JSONDict, subscription_id: Any) -> JSONDict | None:
    """A legacy GET-stream notification for one listen stream, tagged, or None if not asked for."""
    method = note.get("method")
    params = jsonrpc.params_of(note)
    wanted = False
    for key, (_, list_method) in LIST_CHANGED.items():
        if method == list_method and honored.get(key):
            wanted = True
    if method == "notifications/resources/updated":
        uri = params.get("uri")
        wanted = isinstance(uri, str) and any(uri_within(uri, s) for s in honored.get("resourceSubscriptions", ()))
    if not wanted:
        return None
    return {**note, "params": meta.with_meta(params, meta.SUBSCRIPTION_ID, subscription_id)}


def acknowledgement(honored: JSONDict, subscription_id: Any) -> JSONDict:
    return jsonrpc.notification(
        "notifications/subscriptions/acknowledged",
        {"notifications": honored, "_meta": {meta.SUBSCRIPTION_ID: subscription_id}},
    )


def listen_closed(subscription_id: Any) -> JSONDict:
    """The graceful end of a listen stream ended by the proxy (e.g. shutdown)."""
    return jsonrpc.result_response(
        subscription_id, {"resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: subscription_id}}
    )


# ---------------------------------------------------------------- tools a legacy server runs only as tasks
# A 2025-11-25 tool with `execution.taskSupport: "required"` must be called task-augmented
# (2025-11-25/basic/utilities/tasks.mdx, "Tool-Level Negotiation"); a modern client cannot hold a
# 2025-11-25 task, so the proxy makes the call as one and reads its `tasks/result` as the reply.


def task_required_tools(result: object) -> set[str]:
    """The names of the tools of a tools/list result that run only as tasks."""
    return _tools_by_task_support(result, ("required",))


def task_capable_tools(result: object) -> set[str]:
    """The names of the tools of a tools/list result that may run as tasks (optional or required)."""
    return _tools_by_task_support(result, ("optional", "required"))


def _tools_by_task_support(result: object, levels: tuple[str, ...]) -> set[str]:
    tools = jsonrpc.obj(result).get("tools")
    found: set[str] = set()
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            if jsonrpc.obj(tool.get("execution")).get("taskSupport") in levels:
                found.add(tool["name"])
    return found


def runs_tool_calls_as_tasks(server_caps: JSONDict) -> bool:
    """The server said it takes task-augmented tools/call (ServerCapabilities.tasks)."""
    tasks = server_caps.get("tasks")
    if not isinstance(tasks, dict):  # most servers: no tasks at all, decided in one lookup
        return False
    requests = jsonrpc.obj(tasks.get("requests"))
    return isinstance(jsonrpc.obj(requests.get("tools")).get("call"), dict)


def task_augmented(outgoing: JSONDict) -> JSONDict:
    """The upstream tools/call asking for a task (the server's own retention: no ttl asked)."""
    return {**outgoing, "params": {**jsonrpc.obj(outgoing.get("params")), "task": {}}}


def created_task_id(reply: JSONDict) -> str | None:
    """The id of the task a CreateTaskResult names; None for any other reply (an error, or a server
    that ran the call at once: that reply is then the call's)."""
    task = jsonrpc.obj(jsonrpc.obj(reply.get("result")).get("task"))
    task_id = task.get("taskId")
    return task_id if isinstance(task_id, str) and task_id else None


def task_result_request(request_id: jsonrpc.RequestId, task_id: str) -> JSONDict:
    return jsonrpc.request(request_id, "tasks/result", {"taskId": task_id})


def task_cancel_request(request_id: jsonrpc.RequestId, task_id: str) -> JSONDict:
    return jsonrpc.request(request_id, "tasks/cancel", {"taskId": task_id})


def as_call_reply(reply: JSONDict, call_id: jsonrpc.RequestId) -> JSONDict:
    """The `tasks/result` reply as the reply to the call it stands for: under the call's id, the
    result without the related-task tag (the client knows of no task)."""
    out = {**reply, "id": call_id}
    result = reply.get("result")
    if isinstance(result, dict) and isinstance(result.get("_meta"), dict) and meta.RELATED_TASK in result["_meta"]:
        rest = {k: v for k, v in result["_meta"].items() if k != meta.RELATED_TASK}
        out["result"] = {k: v for k, v in result.items() if k != "_meta"} | ({"_meta": rest} if rest else {})
    return out
