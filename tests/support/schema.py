"""Validate wire messages against the official MCP JSON schemas of one revision.

The schemas are vendored in tests/schemas (copies of `schema/<revision>/schema.json` from the
specification repository, modelcontextprotocol/modelcontextprotocol), and the tasks extension's as
revision "ext-tasks" (`schema/draft/schema.json` of modelcontextprotocol/ext-tasks at e4345978,
the io.modelcontextprotocol/tasks extension's own repository).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator, Draft202012Validator

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "tests" / "schemas"

RESULT_TYPES = {
    "initialize": "InitializeResult",
    "ping": "EmptyResult",
    "logging/setLevel": "EmptyResult",
    "resources/subscribe": "EmptyResult",
    "resources/unsubscribe": "EmptyResult",
    "server/discover": "DiscoverResult",
    "tools/list": "ListToolsResult",
    "tools/call": "CallToolResult",
    "prompts/list": "ListPromptsResult",
    "prompts/get": "GetPromptResult",
    "resources/list": "ListResourcesResult",
    "resources/templates/list": "ListResourceTemplatesResult",
    "resources/read": "ReadResourceResult",
    "completion/complete": "CompleteResult",
    "subscriptions/listen": "SubscriptionsListenResult",
    "tasks/get": "GetTaskResult",
    "tasks/result": "GetTaskPayloadResult",
    "tasks/cancel": "CancelTaskResult",
    "tasks/list": "ListTasksResult",
}
SERVER_REQUEST_TYPES = {
    "elicitation/create": "ElicitRequest",
    "sampling/createMessage": "CreateMessageRequest",
    "roots/list": "ListRootsRequest",
    "ping": "PingRequest",
}


TASK_EXTENSION = "ext-tasks"
# The extension's own schema (self-contained: its `$defs` carry the core types it uses), vendored
# from modelcontextprotocol/ext-tasks (tests/schemas/README.md).
EXT_TASKS_SCHEMA = SCHEMAS / "ext-tasks-e4345978.json"
_TASK_RESULT_TYPES = {
    "tasks/get": "GetTaskResult",
    "tasks/update": "UpdateTaskResult",
    "tasks/cancel": "CancelTaskResult",
}


def _is_task_extension(message: dict[str, Any], request_method: str | None) -> bool:
    """A message of the tasks extension's rather than the core's: a task handle, an answer to a
    tasks/* request, a task notification."""
    if "result" in message:
        result = message["result"]
        handle = request_method == "tools/call" and isinstance(result, dict) and result.get("resultType") == "task"
        return handle or request_method in _TASK_RESULT_TYPES
    return message.get("method") == "notifications/tasks"


def _task_extension_errors(message: dict[str, Any], request_method: str | None) -> list[str]:
    if "result" not in message:
        return errors(TASK_EXTENSION, "TaskStatusNotification", message)
    definition = "CreateTaskResult" if request_method == "tools/call" else _TASK_RESULT_TYPES[str(request_method)]
    return errors(TASK_EXTENSION, definition, message["result"])


def schema_path(revision: str) -> Path:
    path = EXT_TASKS_SCHEMA if revision == TASK_EXTENSION else SCHEMAS / f"schema-{revision}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no schema for revision {revision} at {path}")
    return path


@cache
def _schema(revision: str) -> dict[str, Any]:
    return json.loads(schema_path(revision).read_text())


@cache
def _validator(revision: str, definition: str) -> Draft7Validator | Draft202012Validator:
    schema = _schema(revision)
    if "$defs" in schema:
        return Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": schema["$defs"]})
    return Draft7Validator({"$ref": f"#/definitions/{definition}", "definitions": schema["definitions"]})


@cache
def client_request_methods(revision: str) -> frozenset[str]:
    """The methods a revision's schema knows as client requests. Others (an extension's: MCP Apps,
    Skills, a third party's) are JSON-RPC requests the schema says nothing more of."""
    return _methods_of(revision, "ClientRequest")


def client_notification_methods(revision: str) -> frozenset[str]:
    """The methods a revision's schema knows as client notifications (others: an extension's)."""
    return _methods_of(revision, "ClientNotification")


def _methods_of(revision: str, union: str) -> frozenset[str]:
    defs = _schema(revision)["$defs"]
    methods = set()
    for option in defs[union]["anyOf"]:
        definition = defs[option["$ref"].rsplit("/", 1)[1]]
        methods.add(definition["properties"]["method"]["const"])
    return frozenset(methods)


def has_definition(revision: str, definition: str) -> bool:
    schema = _schema(revision)
    return definition in schema.get("$defs", schema.get("definitions", {}))


def errors(revision: str, definition: str, value: Any) -> list[str]:
    """Schema violations of `value` as `definition` in `revision` (empty when valid)."""
    return [
        f"{definition} at /{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in _validator(revision, definition).iter_errors(value)
    ]


def server_message_errors(revision: str, message: dict[str, Any], request_method: str | None = None) -> list[str]:
    """Check one message a server (or the proxy acting as one) sent, as precisely as possible.

    The envelope is checked as a JSONRPCMessage; a result is also checked against the result
    type of the request it answers, a notification or request against its own definition.
    """
    problems = errors(revision, "JSONRPCMessage", message)
    modern = revision == "2026-07-28"
    if modern and _is_task_extension(message, request_method):
        return problems + _task_extension_errors(message, request_method)
    if "result" in message and request_method in RESULT_TYPES:
        result = message["result"]
        definition = RESULT_TYPES[request_method]
        if modern and isinstance(result, dict) and result.get("resultType") == "input_required":
            definition = "InputRequiredResult"
        elif not modern and request_method == "tools/call" and isinstance(result, dict) and "task" in result:
            definition = "CreateTaskResult"  # a task-augmented call (2025-11-25)
        if has_definition(revision, definition):
            problems += errors(revision, definition, result)
    elif "method" in message and "id" in message:
        problems += errors(revision, "ServerRequest", message) if has_definition(revision, "ServerRequest") else []
        definition = SERVER_REQUEST_TYPES.get(message["method"])
        if definition and not modern:
            problems += errors(revision, definition, message)
    elif "method" in message:
        problems += errors(revision, "ServerNotification", message)
    return problems


def ext_tasks_errors(definition: str, value: Any) -> list[str]:
    """Violations of `value` as `definition` of the tasks extension's schema (empty when valid)."""
    return errors(TASK_EXTENSION, definition, value)
