"""Tasks hosted for 2025-11-25 clients (proxy/protocol/legacy_tasks.py): the records, the shapes
a client sees and how each method answers, checked against the 2025-11-25 schema where it has one
(2025-11-25/basic/utilities/tasks.mdx)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol import legacy_tasks as lt
from tests.support.schema import errors

NOW = 1_764_633_600.5  # 2025-12-02T00:00:00.5Z
POLICY = lt.Policy(default_ttl_ms=3_600_000, max_ttl_ms=86_400_000, poll_interval_ms=1000, page_size=2)
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "research", "arguments": {"q": "x"}}}


def validate(revision: str, definition: str, value: Any) -> None:
    assert errors(revision, definition, value) == []


def tasked(task: Any = None, **params: Any) -> dict[str, Any]:
    return {**CALL, "params": {**CALL["params"], "task": {} if task is None else task, **params}}


def record(task_id: str = "t1", principal: str = "alice", **changes: Any) -> lt.TaskRecord:
    return replace(lt.new_task(task_id, principal, tasked(), NOW, POLICY), **changes)


def test_a_task_request_is_a_tools_call_with_params_task() -> None:
    assert lt.is_task_request(tasked())
    assert not lt.is_task_request(CALL)
    assert not lt.is_task_request({**tasked(), "method": "prompts/get"})
    assert not lt.is_task_request({"jsonrpc": "2.0", "id": 1, "method": "tools/call"})


def test_the_call_runs_upstream_without_task_and_every_other_field_as_sent() -> None:
    message = tasked({"ttl": 5}, _meta={"progressToken": 3}, extra={"kept": True})
    assert lt.untasked(message) == {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "research", "arguments": {"q": "x"}, "_meta": {"progressToken": 3}, "extra": {"kept": True}},
    }
    assert "task" in message["params"]  # the request itself is left alone


@pytest.mark.parametrize(
    ("task", "ttl"),
    [({}, 3_600_000), ({"ttl": 60_000}, 60_000), ({"ttl": 10**12}, 86_400_000), ({"ttl": 0}, 0), ({"ttl": 1.9}, 1)],
)
def test_retention_is_what_the_client_asked_for_capped_or_the_default(task: dict[str, Any], ttl: int) -> None:
    created = lt.new_task("t1", "alice", tasked(task), NOW, POLICY, owner="boot@r1")
    assert (created.ttl_ms, created.status, created.tool, created.owner) == (ttl, "working", "research", "boot@r1")
    assert created.created_at == created.updated_at == NOW
    assert created.expires_at == NOW + ttl / 1000


@pytest.mark.parametrize("task", [None, "soon", [], {"ttl": -1}, {"ttl": "60"}, {"ttl": True}])
def test_a_task_that_is_not_task_metadata_is_invalid_params(task: Any) -> None:
    message = {**CALL, "params": {**CALL["params"], "task": task}}
    with pytest.raises(lt.TaskRefused) as refused:
        lt.new_task("t1", "alice", message, NOW, POLICY)
    assert refused.value.code == jsonrpc.INVALID_PARAMS


def test_the_create_task_result_and_the_task_follow_the_schema() -> None:
    result = lt.create_task_result(record())
    assert result == {
        "task": {
            "taskId": "t1",
            "status": "working",
            "createdAt": "2025-12-02T00:00:00.500Z",
            "lastUpdatedAt": "2025-12-02T00:00:00.500Z",
            "ttl": 3_600_000,
            "pollInterval": 1000,
        }
    }
    validate("2025-11-25", "CreateTaskResult", result)
    failed = lt.finished(record(), jsonrpc.error_response(None, -32603, "boom"), NOW + 2)
    validate("2025-11-25", "GetTaskResult", lt.task_object(failed))
    assert lt.task_object(failed)["statusMessage"] == "boom"
    validate("2025-11-25", "TaskStatusNotification", lt.status_notification(failed))


def test_records_round_trip_through_bytes_and_unknown_versions_are_not_read() -> None:
    done = lt.finished(record(), jsonrpc.result_response(None, {"content": []}), NOW + 1)
    assert lt.TaskRecord.decode(done.encode()) == done
    assert lt.TaskRecord.decode(b'{"v": 2, "task_id": "t1"}') is None
    assert lt.TaskRecord.decode(b'{"v": 1, "unknown": 1}') is None
    assert lt.TaskRecord.decode(b"not json") is None
    assert lt.TaskRecord.decode(b"[1]") is None


def test_a_result_completes_and_an_error_or_an_iserror_result_fails() -> None:
    ok = lt.finished(record(), {"jsonrpc": "2.0", "id": 7, "result": {"content": [], "isError": False}}, NOW + 1)
    assert (ok.status, ok.updated_at, ok.status_message) == ("completed", NOW + 1, None)
    tool_error = lt.finished(record(), {"jsonrpc": "2.0", "id": 7, "result": {"content": [], "isError": True}}, NOW)
    assert tool_error.status == "failed"
    error = lt.finished(record(), jsonrpc.error_response(7, -32602, "no such tool"), NOW)
    assert (error.status, error.status_message) == ("failed", "no such tool")
    for broken in ({"jsonrpc": "2.0", "id": 7, "error": {"code": 1}}, {"error": 5}, {"result": [1]}, {}):
        failed = lt.finished(record(), broken, NOW)
        assert (failed.status, failed.status_message) == ("failed", "the call ended without a result or an error")
        assert jsonrpc.kind(lt.result_reply(failed, 9)) == "response"


def test_a_cancelled_task_stays_cancelled_when_its_result_arrives() -> None:
    gone = lt.cancelled(record(), NOW + 1)
    assert (gone.status, gone.status_message) == ("cancelled", lt.CANCELLED_MESSAGE)
    assert lt.finished(gone, jsonrpc.result_response(7, {"content": []}), NOW + 2) is gone
    assert lt.lost(gone, "shut down", NOW + 2) is gone


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_a_task_that_ended_cannot_be_cancelled(status: str) -> None:
    with pytest.raises(lt.TaskRefused) as refused:
        lt.cancelled(record(status=status), NOW)
    assert refused.value.code == jsonrpc.INVALID_PARAMS
    assert refused.value.message == f"Cannot cancel task: already in terminal status '{status}'"


def test_input_moves_the_task_to_input_required_and_answers_back_to_working() -> None:
    waiting = lt.asked(record(), NOW + 1)
    assert (waiting.status, waiting.updated_at) == ("input_required", NOW + 1)
    assert lt.asked(waiting, NOW + 2) is waiting
    working = lt.answered(waiting, NOW + 3)
    assert (working.status, working.updated_at) == ("working", NOW + 3)
    assert lt.answered(working, NOW + 4) is working
    done = lt.finished(working, jsonrpc.result_response(7, {}), NOW)
    assert lt.asked(done, NOW) is done


def test_a_lost_call_fails_its_task_with_the_reason() -> None:
    failed = lt.lost(record(), "the proxy shut down", NOW + 1)
    assert (failed.status, failed.status_message) == ("failed", "the proxy shut down")
    assert lt.result_reply(failed, 9) == jsonrpc.error_response(
        9, jsonrpc.INTERNAL_ERROR, "the proxy shut down", {"reason": "task_lost"}
    )


def test_tasks_result_is_what_the_call_answered_tagged_with_its_task() -> None:
    result = {"content": [{"type": "text", "text": "done"}], "_meta": {"kept": 1}}
    done = lt.finished(record(), {"jsonrpc": "2.0", "id": 7, "result": result}, NOW)
    reply = lt.result_reply(done, 12)
    assert reply == {
        "jsonrpc": "2.0",
        "id": 12,
        "result": {**result, "_meta": {"kept": 1, meta.RELATED_TASK: {"taskId": "t1"}}},
    }
    validate("2025-11-25", "GetTaskPayloadResult", reply["result"])
    failed = lt.finished(record(), jsonrpc.error_response(7, -32602, "no such tool", {"tool": "x"}), NOW)
    assert lt.result_reply(failed, 12) == jsonrpc.error_response(12, -32602, "no such tool", {"tool": "x"})


def test_a_cancelled_task_has_no_result() -> None:
    with pytest.raises(lt.TaskRefused) as refused:
        lt.result_reply(lt.cancelled(record(), NOW), 12)
    assert refused.value.code == jsonrpc.INVALID_PARAMS
    assert refused.value.data == {"taskId": "t1", "status": "cancelled"}


def test_what_the_call_sends_meanwhile_is_tagged_with_its_task() -> None:
    ask = jsonrpc.request(3, "elicitation/create", {"message": "who?", "_meta": {"x": 1}})
    assert lt.related(ask, "t1")["params"] == {
        "message": "who?",
        "_meta": {"x": 1, meta.RELATED_TASK: {"taskId": "t1"}},
    }
    assert ask["params"]["_meta"] == {"x": 1}  # a copy
    bare = lt.related(jsonrpc.notification("notifications/message"), "t1")
    assert bare["params"] == {"_meta": {meta.RELATED_TASK: {"taskId": "t1"}}}


@pytest.mark.parametrize("params", [{}, {"taskId": ""}, {"taskId": 3}])
def test_a_request_about_a_task_needs_its_id(params: dict[str, Any]) -> None:
    with pytest.raises(lt.TaskRefused) as refused:
        lt.task_id_of(jsonrpc.request(1, "tasks/get", params))
    assert refused.value.code == jsonrpc.INVALID_PARAMS
    assert lt.task_id_of(jsonrpc.request(1, "tasks/get", {"taskId": "t9"})) == "t9"


def test_unknown_foreign_and_expired_tasks_are_all_not_found() -> None:
    mine = record()
    assert lt.visible(mine, "alice", NOW) is mine
    for found, principal, now in [(None, "alice", NOW), (mine, "bob", NOW), (mine, "alice", mine.expires_at)]:
        with pytest.raises(lt.TaskRefused) as refused:
            lt.visible(found, principal, now)
        assert (refused.value.code, refused.value.message) == (jsonrpc.INVALID_PARAMS, lt.NOT_FOUND)


def test_pages_are_oldest_first_with_a_cursor_while_there_are_more() -> None:
    records = [record(f"t{i}", created_at=NOW + i, updated_at=NOW + i) for i in range(3)]
    first = lt.list_result(records, 2)
    assert [t["taskId"] for t in first["tasks"]] == ["t0", "t1"]
    validate("2025-11-25", "ListTasksResult", first)
    assert lt.decode_cursor(first["nextCursor"]) == (NOW + 1, "t1")
    last = lt.list_result(records[2:], 2)
    assert [t["taskId"] for t in last["tasks"]] == ["t2"] and "nextCursor" not in last
    assert lt.list_result([], 2) == {"tasks": []}


@pytest.mark.parametrize("cursor", [3, "", "not base64 !", "WzFd", "WyJhIiwiYiJd", "bnVsbA"])
def test_a_cursor_the_proxy_did_not_give_is_invalid_params(cursor: Any) -> None:
    with pytest.raises(lt.TaskRefused) as refused:
        lt.decode_cursor(cursor)
    assert refused.value.code == jsonrpc.INVALID_PARAMS


def test_clients_of_2025_11_25_are_told_the_proxy_hosts_tasks_older_ones_are_not() -> None:
    capabilities = {"tools": {"listChanged": True}, "tasks": {"requests": {}}}
    assert lt.advertise(capabilities, "2025-11-25") == {"tools": {"listChanged": True}, "tasks": lt.SERVER_CAPABILITY}
    validate("2025-11-25", "ServerCapabilities", lt.advertise(capabilities, "2025-11-25"))
    assert lt.advertise(capabilities, "2025-06-18") is capabilities
    assert lt.supports_tasks("2025-11-25") and not lt.supports_tasks("2024-11-05")


def test_every_tool_may_run_as_a_task_for_clients_with_tasks() -> None:
    page = {"tools": [{"name": "a", "inputSchema": {}}, {"name": "b", "execution": {"taskSupport": "required"}}, 3]}
    marked = lt.mark_tools(page, "2025-11-25")
    assert marked["tools"] == [
        {"name": "a", "inputSchema": {}, "execution": {"taskSupport": "optional"}},
        {"name": "b", "execution": {"taskSupport": "required"}},
        3,
    ]
    assert lt.mark_tools(page, "2025-06-18") is page
    assert lt.mark_tools({"nextCursor": "x"}, "2025-11-25") == {"nextCursor": "x"}
