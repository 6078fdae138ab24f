"""Tasks hosted for 2026-07-28 clients that declare the tasks extension (proxy/protocol/
modern_tasks.py): what they see of a record, checked against the extension's schema (the
io.modelcontextprotocol/tasks extension, specification/draft/tasks.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol import legacy_tasks as lt
from proxy.protocol import modern_tasks as mt
from proxy.protocol import task_extension as te
from tests.support.schema import errors

NOW = 1_764_633_600.5  # 2025-12-02T00:00:00.5Z
POLICY = lt.Policy(default_ttl_ms=3_600_000, max_ttl_ms=86_400_000, poll_interval_ms=1000, page_size=2)
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "research", "arguments": {}}}
RESULT = {"resultType": "complete", "content": [{"type": "text", "text": "done"}], "isError": False}
FORM = {"mode": "form", "message": "Sure?", "requestedSchema": {"type": "object", "properties": {}}}
ASK = {"k1": {"method": "elicitation/create", "params": FORM}}


def record(**changes: Any) -> lt.TaskRecord:
    return replace(lt.new_task("t1", "alice", CALL, NOW, POLICY), **changes)


def finished(reply: dict[str, Any]) -> lt.TaskRecord:
    return lt.finished(record(), {"jsonrpc": "2.0", "id": 7, **reply}, NOW + 2)


def test_the_extension_is_declared_per_request_in_the_client_capabilities() -> None:
    assert te.declared({"extensions": {te.EXTENSION: {}}})
    assert not te.declared({})
    assert not te.declared({"tasks": {"requests": {"tools": {"call": {}}}}})  # 2025-11-25's is not it
    assert not te.declared(None)


def test_a_call_without_task_gets_the_default_retention() -> None:
    assert lt.new_task("t1", "alice", CALL, NOW, POLICY).ttl_ms == 3_600_000


def test_the_handle_is_flat_with_the_renamed_fields_and_nothing_inline() -> None:
    handle = mt.create_result(record())
    assert handle == {
        "resultType": "task",
        "taskId": "t1",
        "status": "working",
        "createdAt": "2025-12-02T00:00:00.500Z",
        "lastUpdatedAt": "2025-12-02T00:00:00.500Z",
        "ttlMs": 3_600_000,
        "pollIntervalMs": 1000,
    }
    assert errors("ext-tasks", "CreateTaskResult", handle) == []


def test_tasks_get_inlines_the_result_without_related_task() -> None:
    tagged = {**RESULT, "_meta": {meta.RELATED_TASK: {"taskId": "u1"}, "x/kept": 1}}
    task = mt.get_result(finished({"result": tagged}))
    assert task["resultType"] == "complete" and task["status"] == "completed"
    assert task["result"] == {**RESULT, "_meta": {"x/kept": 1}}
    assert "error" not in task and "inputRequests" not in task
    assert errors("ext-tasks", "GetTaskResult", task) == []


def test_a_tool_error_is_completed_for_the_extension_though_2025_called_it_failed() -> None:
    ended = finished({"result": {**RESULT, "isError": True}})
    assert ended.status == "failed"  # the record keeps 2025-11-25's status
    task = mt.get_result(ended)
    assert task["status"] == "completed" and task["result"]["isError"] is True
    assert errors("ext-tasks", "GetTaskResult", task) == []


def test_a_jsonrpc_error_is_failed_with_the_error_inline() -> None:
    task = mt.get_result(finished({"error": {"code": -32603, "message": "rate limited"}}))
    assert task["status"] == "failed" and task["error"] == {"code": -32603, "message": "rate limited"}
    assert task["statusMessage"] == "rate limited" and "result" not in task
    assert errors("ext-tasks", "GetTaskResult", task) == []


def test_input_required_shows_the_outstanding_requests_and_answered_goes_back_to_working() -> None:
    asking = lt.asked(record(), NOW + 1, ASK)
    task = mt.get_result(asking)
    assert task["status"] == "input_required" and task["inputRequests"] == ASK
    assert errors("ext-tasks", "GetTaskResult", task) == []
    working = lt.answered(asking, NOW + 2)
    assert working.status == "working" and working.input_requests is None
    assert "inputRequests" not in mt.get_result(working)


def test_fewer_outstanding_requests_are_a_change_the_same_ones_are_not() -> None:
    two = {**ASK, "k2": ASK["k1"]}
    asking = lt.asked(record(), NOW + 1, two)
    assert lt.asked(asking, NOW + 2, two) is asking
    fewer = lt.asked(asking, NOW + 2, ASK)
    assert fewer.input_requests == ASK and fewer.updated_at == NOW + 2


def test_a_cancelled_task_shows_no_requests() -> None:
    cancelled = lt.cancelled(lt.asked(record(), NOW + 1, ASK), NOW + 2)
    task = mt.get_result(cancelled)
    assert task["status"] == "cancelled" and "inputRequests" not in task
    assert errors("ext-tasks", "GetTaskResult", task) == []


def test_the_acknowledgement_is_an_empty_complete_result() -> None:
    assert mt.ack() == {"resultType": "complete"}
    assert errors("ext-tasks", "UpdateTaskResult", mt.ack()) == []
    assert errors("ext-tasks", "CancelTaskResult", mt.ack()) == []


def test_a_status_notification_is_the_detailed_task_tagged_with_the_subscription() -> None:
    note = mt.notification(finished({"result": RESULT}), "l-1")
    assert note["method"] == "notifications/tasks"
    assert note["params"]["_meta"] == {meta.SUBSCRIPTION_ID: "l-1"}
    assert note["params"]["result"] == RESULT and "resultType" not in note["params"]
    assert errors("ext-tasks", "TaskStatusNotification", note) == []


def test_discover_gains_the_extension_beside_what_the_server_declared() -> None:
    result = {"resultType": "complete", "capabilities": {"tools": {}, "extensions": {"x/y": {"a": 1}}}}
    assert mt.advertise(result)["capabilities"] == {"tools": {}, "extensions": {"x/y": {"a": 1}, te.EXTENSION: {}}}


@pytest.mark.parametrize("responses", [None, [], "yes", {"k1": "accept"}, {"k1": None}])
def test_input_responses_must_be_an_object_of_answers(responses: Any) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tasks/update", "params": {"taskId": "t1"}}
    if responses is not None:
        message["params"]["inputResponses"] = responses
    with pytest.raises(lt.TaskRefused) as refused:
        mt.input_responses(message)
    assert refused.value.code == jsonrpc.INVALID_PARAMS


@pytest.mark.parametrize("ids", [None, "t1", [1], [""], [None]])
def test_listened_task_ids_must_be_a_list_of_ids(ids: Any) -> None:
    with pytest.raises(lt.TaskRefused) as refused:
        mt.listened_task_ids({} if ids is None else {"taskIds": ids})
    assert refused.value.code == jsonrpc.INVALID_PARAMS
    assert mt.listened_task_ids({"taskIds": ["a", "b", "a"]}) == ["a", "b"]


def test_missing_extension_is_32021_with_the_capability_needed() -> None:
    refused = mt.missing_extension()
    assert refused.code == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert refused.data == {"requiredCapabilities": {"extensions": {te.EXTENSION: {}}}}


def test_a_record_of_a_later_version_with_fields_this_one_lacks_is_still_read() -> None:
    fields = orjson.loads(record().encode())
    decoded = lt.TaskRecord.decode(orjson.dumps({**fields, "added_later": [1]}))
    assert decoded == record()
