"""The 2025-11-25 task-tools fixture (tests/peers/fixtures/legacy-tasks-fixture.mjs) is what it
claims, checked with no proxy in between by real 2025-11-25 task requestors: the TypeScript SDK v1
(tests/e2e/peers/ts_task_client.cjs, `client.experimental.tasks`) and mcp 1.30
(tests/e2e/peers/legacy_client.py, `session.experimental`). It is the legacy upstream the
conformance runner's tasks-* scenarios reach through the proxy (tests/e2e/test_conformance_tasks.py),
so each tool must run as a task upstream and end as its scenario needs: completed, failed with a
tool error, failed with a JSON-RPC error, parked on one or two elicitations, cancelled (counted).
The spec's 2025-11-25 tasks page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_tasks_e2e import run_tagged
from tests.support import peers, schema
from tests.support.peer_fixtures import legacy_tasks_counts, legacy_tasks_server
from tests.support.sdk_drivers import legacy_client_argv

pytestmark = pytest.mark.e2e

REVISION = "2025-11-25"
RELATED = "io.modelcontextprotocol/related-task"
TS_CLIENT = peers.PEER_SCRIPTS / "ts_task_client.cjs"
TIMEOUT_S = 60.0

Observed = dict[str, Any]


def run_checked(argv: list[str], env: dict[str, str]) -> Observed:
    """One driver scenario (its processes reaped after it); fails on its error."""
    observed = run_tagged(argv, env, TIMEOUT_S)
    assert "error" not in observed, observed
    assert observed["_exit"] == 0, observed["_stderr"]
    assert observed["protocolVersion"] == REVISION
    return observed


def run_ts(url: str, scenario: str, **spec: Any) -> Observed:
    argv = ["node", str(TS_CLIENT), json.dumps({"url": url, "scenario": scenario, **spec})]
    return run_checked(argv, peers.node_env())


def run_py(url: str, scenario: str, **args: Any) -> Observed:
    return run_checked(legacy_client_argv(url, scenario, args, TIMEOUT_S), {})


def related(task_id: str) -> dict[str, Any]:
    return {RELATED: {"taskId": task_id}}


def statuses(events: list[dict[str, Any]]) -> list[str]:
    """The task statuses the TypeScript SDK's stream reported, repeats folded."""
    seen = [e["task"]["status"] for e in events if e["type"] in ("taskCreated", "taskStatus")]
    return [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]


def valid_tasks(*tasks: dict[str, Any]) -> None:
    for task in tasks:
        assert schema.errors(REVISION, "Task", task) == [], task


@pytest.fixture(scope="module")
def fixture_url(legacy_tasks: str) -> str:
    return legacy_tasks


@pytest.fixture(scope="module")
def relaxed_url(logs_dir: Path) -> Iterator[str]:
    """The fixture with failing_job made `optional` (the default is `required`)."""
    with legacy_tasks_server(logs_dir / "legacy-tasks-optional.log", FAILING_JOB_TASK_SUPPORT="optional") as url:
        yield url


# ---------------------------------------------------------------- tools/list and plain tools


def test_tools_list_marks_each_task_tool_and_greet_is_a_plain_call(fixture_url: str) -> None:
    observed = run_ts(fixture_url, "stream", tool="greet", arguments={"name": "World"})
    assert observed["serverCapabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    support = {t["name"]: (t["execution"] or {}).get("taskSupport") for t in observed["tools"]}
    assert support == {
        "greet": "forbidden",
        "cancelled_count": "forbidden",
        "cancelled_calls_count": "forbidden",
        "slow_compute": "optional",
        "failing_job": "required",
        "protocol_error_job": "optional",
        "confirm_delete": "optional",
        "multi_input": "optional",
        "test_tool_with_task": "required",
    }
    # callToolStream makes a plain call of a tool listed as one that never runs as a task.
    assert observed["events"] == [
        {"type": "result", "result": {"content": [{"type": "text", "text": "Hello, World!"}]}}
    ]


# ---------------------------------------------------------------- each task tool, as a task


def test_slow_compute_runs_as_a_task_with_its_progress_on_the_tasks_result_stream(fixture_url: str) -> None:
    observed = run_ts(fixture_url, "stream", tool="slow_compute", arguments={"seconds": 0.5, "label": "y"}, ttl=60000)
    events = observed["events"]
    created = events[0]["task"]
    assert events[0]["type"] == "taskCreated" and created["ttl"] == 60000
    assert statuses(events) == ["working", "completed"]
    task_id = created["taskId"]
    assert events[-1] == {
        "type": "result",
        "result": {"content": [{"type": "text", "text": "slow_compute y: done after 0.5s"}], "_meta": related(task_id)},
    }
    assert [(p["progress"], p["total"], p["_meta"]) for p in observed["progress"]] == [
        (0, 0.5, related(task_id)),
        (0.5, 0.5, related(task_id)),
    ]
    valid_tasks(*(e["task"] for e in events if "task" in e))


def test_failing_job_is_a_failed_task_whose_result_is_the_tool_error(fixture_url: str) -> None:
    observed = run_py(fixture_url, "task", tool="failing_job", arguments={})
    task_id = observed["created"]["task"]["taskId"]
    assert [s["status"] for s in observed["statuses"]][-1] == "failed"  # 2025-11-25: isError fails a task
    assert observed["result"]["content"] == [{"type": "text", "text": "failing_job: the job failed"}]
    assert observed["result"]["isError"] is True
    assert observed["result"]["_meta"] == related(task_id)
    valid_tasks(*observed["statuses"], observed["after"])


def test_protocol_error_job_is_a_failed_task_whose_tasks_result_is_a_json_rpc_error(fixture_url: str) -> None:
    observed = run_py(fixture_url, "task", tool="protocol_error_job", arguments={})
    last = observed["statuses"][-1]
    assert (last["status"], last["statusMessage"]) == ("failed", "protocol_error_job: simulated internal failure")
    assert observed["result"] is None
    assert observed["resultError"] == {
        "code": -32603,
        "message": "MCP error -32603: protocol_error_job: simulated internal failure",
    }


def test_confirm_delete_asks_one_elicitation_on_the_tasks_result_stream(fixture_url: str) -> None:
    observed = run_ts(
        fixture_url, "stream", tool="confirm_delete", arguments={"filename": "a.txt"}, elicit_content={"confirm": True}
    )
    events = observed["events"]
    task_id = events[0]["task"]["taskId"]
    assert statuses(events) == ["input_required"]  # then the SDK waits on tasks/result, where it is asked
    assert events[0]["task"]["statusMessage"] == "Delete a.txt?"
    [asked] = observed["elicitations"]
    assert asked["message"] == "Delete a.txt?" and asked["requestedSchema"]["required"] == ["confirm"]
    assert asked["_meta"] == related(task_id)
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "Deleted a.txt"}]


def test_multi_input_asks_two_elicitations_at_once(fixture_url: str) -> None:
    observed = run_ts(fixture_url, "stream", tool="multi_input", elicit_content={"name": "Ada", "confirm": True})
    events = observed["events"]
    task_id = events[0]["task"]["taskId"]
    assert statuses(events) == ["input_required"]
    assert [(e["message"], e["_meta"]) for e in observed["elicitations"]] == [
        ("multi_input: first name?", related(task_id)),
        ("multi_input: second name?", related(task_id)),
    ]
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "multi_input: Ada, Ada"}]


def test_test_tool_with_task_asks_on_the_call_stream_before_it_creates_the_task(fixture_url: str) -> None:
    observed = run_ts(fixture_url, "stream", tool="test_tool_with_task", elicit_content={"name": "Alice"})
    [asked] = observed["elicitations"]
    assert asked["message"] == "What is your name?" and "_meta" not in asked  # no task exists yet
    events = observed["events"]
    assert events[0]["type"] == "taskCreated" and statuses(events) == ["working", "completed"]
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "Hello, Alice! (from a task)"}]


def test_tasks_cancel_stops_slow_compute_and_is_counted(fixture_url: str) -> None:
    before = legacy_tasks_counts(fixture_url)
    observed = run_ts(fixture_url, "cancel", tool="slow_compute", arguments={"seconds": 30, "label": "c"})
    task_id = observed["taskId"]
    assert observed["progress"], "no progress: the task never ran"
    assert (observed["cancel"]["ok"]["taskId"], observed["cancel"]["ok"]["status"]) == (task_id, "cancelled")
    assert observed["cancelAgain"]["error"]["code"] == -32602  # already terminal
    assert observed["afterCancel"]["ok"]["status"] == "cancelled"  # it stays cancelled: nothing overwrote it
    assert observed["checkAfter"] == observed["checkBefore"] + 1  # the cancelled_count tool
    after = legacy_tasks_counts(fixture_url)
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["cancelledByTool"].get("slow_compute", 0) == before["cancelledByTool"].get("slow_compute", 0) + 1
    valid_tasks(observed["afterCancel"]["ok"])


# ---------------------------------------------------------------- without `task`: the SDK's own paths


def test_an_optional_task_tool_called_without_task_answers_on_the_call_with_progress(fixture_url: str) -> None:
    observed = run_py(
        fixture_url, "progress", tool="slow_compute", arguments={"seconds": 1, "label": "s"}, expect_progress=2
    )
    assert observed["progress"] == [[0, 1, "slow_compute s: 0s of 1s"], [1, 1, "slow_compute s: 1s of 1s"]]
    assert observed["result"]["content"] == [{"type": "text", "text": "slow_compute s: done after 1s"}]


def test_confirm_delete_called_without_task_asks_on_the_call_stream(fixture_url: str) -> None:
    observed = run_py(
        fixture_url,
        "elicitation",
        tool="confirm_delete",
        arguments={"filename": "b.txt"},
        elicit_content={"confirm": True},
    )
    [asked] = observed["elicitations"]
    assert asked["message"] == "Delete b.txt?" and RELATED not in asked.get("_meta", {})
    assert observed["result"]["content"] == [{"type": "text", "text": "Deleted b.txt"}]


def test_a_required_task_tool_called_without_task_is_refused_as_the_sdk_does(fixture_url: str) -> None:
    observed = run_py(fixture_url, "tools", tool="failing_job", arguments={})
    assert observed["result"]["isError"] is True
    assert observed["result"]["content"][0]["text"] == (
        "MCP error -32601: Tool failing_job requires task augmentation (taskSupport: 'required')"
    )


def test_a_cancelled_call_without_task_stops_and_is_counted_apart(fixture_url: str) -> None:
    before = legacy_tasks_counts(fixture_url)
    observed = run_py(
        fixture_url,
        "cancel",
        tool="slow_compute",
        arguments={"seconds": 30},
        check_tool="cancelled_calls_count",
    )
    assert observed["checkAfter"] == observed["checkBefore"] + 1
    after = legacy_tasks_counts(fixture_url)
    assert (after["callsCancelled"], after["cancelled"]) == (before["callsCancelled"] + 1, before["cancelled"])


def test_failing_job_can_be_made_optional(relaxed_url: str) -> None:
    observed = run_py(relaxed_url, "tools", tool="failing_job", arguments={})
    assert "failing_job" in observed["tools"]
    # Optional: the SDK runs the task itself and answers the call with its result.
    assert observed["result"]["content"] == [{"type": "text", "text": "failing_job: the job failed"}]
    assert observed["result"]["isError"] is True
