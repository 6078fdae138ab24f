"""A forwarded call answered with an upstream task of the `io.modelcontextprotocol/tasks` extension,
followed until it ends (proxy/protocol/forwarded_call.py, proxy/protocol/task_extension.py;
io.modelcontextprotocol/tasks extension (specification/draft/tasks.md)). Every tasks/* request
the call sends is checked against the extension's vendored schema."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol import task_extension as te
from proxy.protocol.forwarded_call import (
    TASK_POLL_RETRIES,
    AskClient,
    Fail,
    Finish,
    ForwardedCall,
    InputRound,
    Log,
    SendUpstream,
    WithdrawAsks,
)
from proxy.protocol.headers import METHOD_HEADER, NAME_HEADER
from proxy.protocol.legacy_to_modern import ClientProfile
from proxy.protocol.outcome import UpstreamFailure
from proxy.protocol.versions import LATEST_MODERN
from tests.support.schema import ext_tasks_errors
from tests.unit.protocol.test_forwarded_call import (
    CAPS,
    ELICIT,
    TEXT,
    complete,
    error,
    new,
    reply,
    roundtrip,
    sent,
    started,
)

DECLARING = ClientProfile(LATEST_MODERN, te.with_extension(CAPS), {"name": "legacy-client", "version": "1"}, "info")
TASK_ID = "786512e2-9e0d-44bd-8f29-789f320fe840"


def task(status: str = "working", **fields: Any) -> dict[str, Any]:
    return {
        "taskId": TASK_ID,
        "status": status,
        "createdAt": "2026-07-28T10:30:00Z",
        "lastUpdatedAt": "2026-07-28T10:30:00Z",
        "ttlMs": 60_000,
        "pollIntervalMs": 200,
        **fields,
    }


def created(**fields: Any) -> dict[str, Any]:
    return {"resultType": "task", **task(**fields)}


def got(status: str = "working", **fields: Any) -> dict[str, Any]:
    return {"resultType": "complete", **task(status, **fields)}


def following(**overrides: Any) -> tuple[ForwardedCall, SendUpstream]:
    """A tools/call that declared the extension, answered with a task: its first tasks/get."""
    call = new(profile=DECLARING, **overrides)
    first = started(call)
    assert first.message["params"]["_meta"][meta.CLIENT_CAPABILITIES]["extensions"] == {te.EXTENSION: {}}
    poll = sent(call.upstream_message(reply(first.message["id"], created())))
    return call, poll


def checked(send: SendUpstream, method: str, definition: str) -> SendUpstream:
    assert send.message["method"] == method
    assert ext_tasks_errors(definition, send.message) == []
    assert send.headers[METHOD_HEADER] == method and send.headers[NAME_HEADER] == TASK_ID
    assert send.message["params"]["_meta"][meta.CLIENT_CAPABILITIES]["extensions"] == {te.EXTENSION: {}}
    return send


# ---------------------------------------------------------------- pure helpers


def test_the_extension_is_declared_by_its_key_in_capabilities_extensions():
    assert te.declared({"extensions": {te.EXTENSION: {}}})
    assert not te.declared({"extensions": {"other/ext": {}}})
    assert not te.declared({"tasks": {}}) and not te.declared(None)
    assert te.with_extension({"roots": {}, "extensions": {"other/ext": {"x": 1}}}) == {
        "roots": {},
        "extensions": {"other/ext": {"x": 1}, te.EXTENSION: {}},
    }


def test_the_poll_delay_is_the_tasks_within_bounds_else_the_proxys():
    assert te.poll_delay_s(200, 1000) == 0.2
    assert te.poll_delay_s(None, 1000) == 1.0
    assert te.poll_delay_s(0, 1000) == te.MIN_POLL_MS / 1000
    assert te.poll_delay_s(10**9, 1000) == te.MAX_POLL_MS / 1000


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([], "not an object"),
        ({**task(), "taskId": 5}, "taskId"),
        ({**task(), "status": "running"}, "unknown task status"),
        ({**task(), "ttlMs": "soon"}, "ttlMs"),
        ({**task(), "pollIntervalMs": -1}, "pollIntervalMs"),
        (task("completed"), "no result"),
        (task("failed", error={"message": "no code"}), "JSON-RPC error"),
        (task("input_required"), "inputRequests"),
    ],
)
def test_a_task_against_the_schema_is_refused_with_the_reason(value: Any, reason: str):
    with pytest.raises(te.InvalidTask, match=reason):
        te.parse_task(value)


def test_a_null_ttl_is_unlimited_and_a_create_result_inlines_nothing():
    view = te.parse_task({**task("completed"), "ttlMs": None}, created=True)
    assert (view.ttl_ms, view.result) == (None, None)


# ---------------------------------------------------------------- the call


def test_a_call_that_did_not_declare_the_extension_refuses_a_task_as_an_invalid_result():
    call = new()
    first = started(call)
    assert "extensions" not in first.message["params"]["_meta"][meta.CLIENT_CAPABILITIES]
    actions = call.upstream_message(reply(first.message["id"], created()))
    assert isinstance(actions[-1], Finish) and actions[-1].error is not None
    assert "unsupported resultType 'task'" in actions[-1].error["message"]
    assert call.open_task is None


def test_a_task_is_polled_at_its_interval_until_its_result_is_the_calls():
    call, poll = following()
    checked(poll, "tasks/get", "GetTaskRequest")
    assert poll.delay_s == 0.2 and call.open_task == TASK_ID
    again = sent(call.upstream_message(reply(poll.message["id"], got(pollIntervalMs=400))))
    assert again.delay_s == 0.4 and again.message["id"] != poll.message["id"]
    actions = call.upstream_message(reply(again.message["id"], got("completed", result={"content": TEXT})))
    assert [a.event for a in actions if isinstance(a, Log)] == ["upstream_task_ended"]
    assert actions[-1] == Finish(result={"content": TEXT})
    assert call.done and call.open_task is None and call.cancel_task() is None


def test_the_first_poll_follows_the_creation_and_is_logged():
    call = new(profile=DECLARING, poll_interval_ms=700)
    first = started(call)
    actions = call.upstream_message(reply(first.message["id"], {**created(), "pollIntervalMs": None}))
    [log] = [a for a in actions if isinstance(a, Log)]
    assert (log.level, log.event) == ("info", "upstream_task_followed")
    assert log.fields["task"] == te.short_id(TASK_ID) and TASK_ID not in str(log.fields)
    assert sent(actions).delay_s == 0.7  # the proxy's own interval when the task suggests none


def test_a_failed_task_is_the_calls_json_rpc_error():
    call, poll = following()
    failure = {"code": -32603, "message": "API rate limit exceeded"}
    actions = call.upstream_message(reply(poll.message["id"], got("failed", error=failure)))
    assert actions[-1] == Finish(error=failure)


def test_a_cancelled_task_is_an_error_the_legacy_client_understands():
    call, poll = following()
    actions = call.upstream_message(reply(poll.message["id"], got("cancelled")))
    finish = actions[-1]
    assert isinstance(finish, Finish) and finish.error is not None
    assert finish.error["code"] == jsonrpc.INTERNAL_ERROR and "cancelled" in finish.error["message"]


def test_a_task_the_upstream_no_longer_knows_fails_the_call_saying_so():
    call, poll = following()
    actions = call.upstream_message(error(poll.message["id"], jsonrpc.INVALID_PARAMS, "Task has expired"))
    finish = actions[-1]
    assert isinstance(finish, Finish) and finish.error is not None
    assert finish.error["code"] == jsonrpc.INTERNAL_ERROR
    assert "no longer knows the task" in finish.error["message"]
    assert finish.error["data"]["upstreamError"]["message"] == "Task has expired"
    assert call.open_task is None  # nothing left to cancel


def test_another_error_on_tasks_get_fails_the_call_and_leaves_the_task_to_cancel():
    call, poll = following()
    actions = call.upstream_message(error(poll.message["id"], jsonrpc.INTERNAL_ERROR, "store down"))
    assert isinstance(actions[-1], Finish) and "store down" in str(actions[-1].error)
    cancel = call.cancel_task()
    assert cancel is not None
    checked(cancel, "tasks/cancel", "CancelTaskRequest")
    assert call.cancel_task() is None  # cancelled once


def test_input_a_task_needs_is_asked_once_per_key_and_answered_with_tasks_update():
    call, poll = following()
    asking = got("input_required", inputRequests={"name": ELICIT})
    actions = call.upstream_message(reply(poll.message["id"], asking))
    assert isinstance(actions[0], InputRound)
    ask = actions[-1]
    assert isinstance(ask, AskClient) and [a.key for a in ask.asks] == ["name"]
    call = roundtrip(call)  # the state is plain data, mid-follow too
    answer = {"action": "accept", "content": {"name": "Luca"}}
    update = checked(
        sent(call.client_answered("name", jsonrpc.result_response(1, answer))), "tasks/update", "UpdateTaskRequest"
    )
    assert update.message["params"]["inputResponses"] == {"name": answer}
    assert "requestState" not in update.message["params"]  # not a retry of the call
    poll = sent(call.upstream_message(reply(update.message["id"], {"resultType": "complete"})))
    checked(poll, "tasks/get", "GetTaskRequest")
    # The answer is not reflected yet (eventually consistent): the key is not asked again.
    poll = sent(call.upstream_message(reply(poll.message["id"], asking)))
    assert poll.message["method"] == "tasks/get"
    second = call.upstream_message(
        reply(poll.message["id"], got("input_required", inputRequests={"name": ELICIT, "city": ELICIT}))
    )
    assert [a.key for a in second[-1].asks] == ["city"]  # type: ignore[union-attr]


def test_input_rounds_of_a_task_count_against_the_limit():
    call, poll = following(max_rounds=1)
    call.upstream_message(reply(poll.message["id"], got("input_required", inputRequests={"a": ELICIT})))
    update = sent(call.client_answered("a", jsonrpc.result_response(1, {"action": "decline"})))
    poll = sent(call.upstream_message(reply(update.message["id"], complete())))
    actions = call.upstream_message(reply(poll.message["id"], got("input_required", inputRequests={"b": ELICIT})))
    assert isinstance(actions[-1], Finish) and "gave up after 1 rounds" in str(actions[-1].error)
    assert call.open_task == TASK_ID  # still running upstream: the driver cancels it


def test_a_round_that_times_out_leaves_the_task_to_cancel():
    call, poll = following()
    call.upstream_message(reply(poll.message["id"], got("input_required", inputRequests={"name": ELICIT})))
    actions = call.round_timed_out()
    assert isinstance(actions[0], WithdrawAsks) and isinstance(actions[-1], Finish)
    assert call.cancel_task() is not None


def test_a_cancelled_call_leaves_its_task_to_cancel_with_the_extension_declared():
    call, _ = following()
    call.cancelled()
    cancel = call.cancel_task()
    assert cancel is not None and cancel.message["params"]["taskId"] == TASK_ID
    assert cancel.message["id"] == "c1.cancel"


@pytest.mark.parametrize(
    "result",
    [
        {**created(), "ttlMs": "soon"},
        {"resultType": "task", "status": "working"},
    ],
)
def test_an_invalid_create_task_result_ends_the_call(result: dict[str, Any]):
    call = new(profile=DECLARING)
    first = started(call)
    actions = call.upstream_message(reply(first.message["id"], result))
    assert [a.event for a in actions if isinstance(a, Log)] == ["upstream_invalid_result"]
    assert isinstance(actions[-1], Finish) and "invalid CreateTaskResult" in str(actions[-1].error)


def test_a_tasks_get_for_another_task_is_invalid():
    call, poll = following()
    actions = call.upstream_message(reply(poll.message["id"], {**got(), "taskId": "other"}))
    assert isinstance(actions[-1], Finish) and "another task" in str(actions[-1].error)


def test_a_poll_that_does_not_get_through_is_tried_again_a_few_times_then_the_call_fails():
    call, _ = following()
    unreachable = UpstreamFailure("up", "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, "is unreachable")
    for attempt in range(1, TASK_POLL_RETRIES + 1):
        actions = call.upstream_failed(unreachable)
        [logged] = [a for a in actions if isinstance(a, Log)]
        assert (logged.event, logged.fields["attempt"]) == ("upstream_task_poll_failed", attempt)
        checked(sent(actions), "tasks/get", "GetTaskRequest")
    assert call.open_task == TASK_ID  # still followed
    failed = call.upstream_failed(unreachable)
    assert any(isinstance(a, Fail) for a in failed)
    assert call.open_task == TASK_ID  # the driver cancels it as the call ends


def test_a_poll_that_gets_through_again_starts_the_count_afresh():
    call, poll = following()
    unreachable = UpstreamFailure("up", "timeout", jsonrpc.UPSTREAM_TIMEOUT, "timed out")
    for _ in range(TASK_POLL_RETRIES):
        poll = sent(call.upstream_failed(unreachable))
    poll = sent(call.upstream_message(reply(poll.message["id"], got("working"))))
    assert call.state.task_poll_failures == 0
    assert not any(isinstance(a, Fail) for a in call.upstream_failed(unreachable))
