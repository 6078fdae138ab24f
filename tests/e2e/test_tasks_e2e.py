"""Tasks the proxy hosts for 2025-11-25 clients of a 2026-07-28 server, driven by real SDK clients:
the TypeScript SDK v1 (tests/e2e/peers/ts_task_client.cjs, `client.experimental.tasks`) and mcp 1.30
(tests/e2e/peers/legacy_client.py, `session.experimental`), through a recording tap in front of the
proxy whose every message to the client is validated against the 2025-11-25 schema. The upstream
is the mcp 2.3 modern server (tests/e2e/peers/modern_server.py). As a yardstick the TypeScript
driver also runs against server-everything's own 2025-11-25 task tool, with no proxy in between.
docs/use/tasks.md; the spec's 2025-11-25 tasks page."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers, schema
from tests.support.procs import reap_tagged
from tests.support.sdk_drivers import legacy_client_argv, observations
from tests.support.tap import schema_violations

pytestmark = pytest.mark.e2e

REVISION = "2025-11-25"
RELATED = "io.modelcontextprotocol/related-task"
NOT_FOUND = "Failed to retrieve task: Task not found"
TS_CLIENT = peers.PEER_SCRIPTS / "ts_task_client.cjs"
TS_PREFIX = "MCP error -32602: "  # the TypeScript SDK's McpError message prefix
# Every driver process carries this variable: whatever of a run is left is found by it.
RUN_TAG = "ERA_PROXY_TEST_TASKS_RUN"
TIMEOUT_S = 60.0

Observed = dict[str, Any]


@pytest.fixture(scope="module")
def tapped(
    proxy_to_modern_server: str, tap_factory: Callable[..., AbstractContextManager[tuple[str, Path]]]
) -> Iterator[tuple[str, Path]]:
    """The proxy (in front of the mcp 2.3 server) behind a recording tap: (url, record)."""
    with tap_factory(proxy_to_modern_server) as (url, record):
        yield url, record


@pytest.fixture
def proxy_url(tapped: tuple[str, Path]) -> Iterator[str]:
    """The tapped proxy; after the test, every message it sent a client so far is schema-valid."""
    url, record = tapped
    yield url
    checked, problems = schema_violations(record)
    assert checked > 0 and problems == [], problems[:10]


def caller() -> dict[str, str]:
    """A caller of its own (tasks belong to the caller's Authorization), so lists are exact."""
    return {"Authorization": f"Bearer tasks-e2e-{uuid.uuid4().hex}"}


def run_tagged(argv: list[str], env: dict[str, str], timeout: float) -> Observed:
    tag = uuid.uuid4().hex
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout + 15,
        env={**os.environ, **env, RUN_TAG: tag},
        check=False,
    )
    left = reap_tagged(RUN_TAG, tag, timeout=5.0)
    assert left == [], f"processes left behind: {left}"
    return observations(done.returncode, done.stdout, done.stderr)


def run_ts(url: str, scenario: str, **spec: Any) -> Observed:
    """One scenario of the TypeScript SDK v1 driver; fails on its error."""
    argv = ["node", str(TS_CLIENT), json.dumps({"url": url, "scenario": scenario, **spec})]
    observed = run_tagged(argv, peers.node_env(), TIMEOUT_S)
    assert "error" not in observed, observed
    assert observed["_exit"] == 0, observed["_stderr"]
    return observed


def run_py(url: str, scenario: str, **args: Any) -> Observed:
    """One scenario of the mcp 1.30 driver; fails on its error."""
    observed = run_tagged(legacy_client_argv(url, scenario, args, TIMEOUT_S), {}, TIMEOUT_S)
    assert "error" not in observed, observed
    assert observed["protocolVersion"] == REVISION
    return observed


def valid_tasks(*tasks: dict[str, Any]) -> None:
    for task in tasks:
        assert schema.errors(REVISION, "Task", task) == [], task


def related(task_id: str) -> dict[str, Any]:
    return {RELATED: {"taskId": task_id}}


def stream_statuses(events: list[dict[str, Any]]) -> list[str]:
    return [e["task"]["status"] for e in events if e["type"] in ("taskCreated", "taskStatus")]


def squeeze(statuses: list[str]) -> list[str]:
    """The statuses in order, repeats folded (how many polls saw one depends on timing)."""
    return [s for i, s in enumerate(statuses) if i == 0 or statuses[i - 1] != s]


def in_order(seen: list[str], expected: list[str]) -> bool:
    """`seen` is `expected` with some left out (notifications/tasks/status is best effort: one sent
    before the client's GET stream was open is not replayed)."""
    rest = iter(expected)
    return all(status in rest for status in seen)


def not_found(prefix: str = "") -> dict[str, Any]:
    return {"error": {"code": -32602, "message": prefix + NOT_FOUND}}


# ---------------------------------------------------------------- the TypeScript SDK v1 client


def test_ts_client_runs_a_call_as_a_task_because_tools_list_marks_it_and_gets_the_tagged_result(
    proxy_url: str,
) -> None:
    observed = run_ts(proxy_url, "stream", tool="echo", arguments={"text": "hi"}, headers=caller())
    assert observed["protocolVersion"] == REVISION
    assert observed["serverCapabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert {t["name"]: t["execution"] for t in observed["tools"]}["echo"] == {"taskSupport": "optional"}
    assert all(t["execution"] == {"taskSupport": "optional"} for t in observed["tools"])
    events = observed["events"]
    # No ttl given: callToolStream made it a task only because the tool is listed as one that may run as one.
    assert events[0]["type"] == "taskCreated" and events[0]["task"]["status"] == "working"
    task_id = events[0]["task"]["taskId"]
    assert squeeze(stream_statuses(events)) == ["working", "completed"]
    assert events[-1] == {
        "type": "result",
        "result": {"content": [{"type": "text", "text": "echo: hi"}], "isError": False, "_meta": related(task_id)},
    }
    valid_tasks(*(e["task"] for e in events if "task" in e))
    assert in_order([n["status"] for n in observed["statusNotifications"]], ["completed"])
    valid_tasks(*observed["statusNotifications"])


def test_ts_client_sees_a_slow_tasks_progress_on_its_tasks_result_stream(proxy_url: str) -> None:
    observed = run_ts(proxy_url, "stream", tool="slow", arguments={"seconds": 0.5}, ttl=60000, headers=caller())
    events = observed["events"]
    task_id = events[0]["task"]["taskId"]
    assert events[0]["task"]["ttl"] == 60000
    assert squeeze(stream_statuses(events)) == ["working", "completed"]
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "slow done"}]
    # The SDK polls tasks/get to the end and only then opens tasks/result: the progress waited for it.
    assert observed["progress"] == [
        {"progress": i, "total": 5, "message": f"step {i} of 5", "_meta": related(task_id)} for i in range(1, 6)
    ]


def test_ts_client_answers_the_elicitation_of_a_task_on_its_tasks_result_stream(proxy_url: str) -> None:
    observed = run_ts(
        proxy_url, "stream", tool="elicit", arguments={"message": "who are you?"}, elicit_content={"name": "Ada"}
    )
    events = observed["events"]
    task_id = events[0]["task"]["taskId"]
    # input_required makes the SDK open tasks/result, where the elicitation is asked.
    assert squeeze(stream_statuses(events)) == ["working", "input_required"]
    [asked] = observed["elicitations"]
    assert asked["message"] == "who are you?"
    assert asked["requestedSchema"]["required"] == ["name"]
    assert asked["_meta"] == related(task_id)
    assert events[-1]["result"]["content"] == [{"type": "text", "text": "elicited: action=accept name=Ada"}]
    assert events[-1]["result"]["_meta"] == related(task_id)
    told = [n["status"] for n in observed["statusNotifications"]]
    assert in_order(told, ["input_required", "working", "completed"]) and told[-1] == "completed", told


def test_ts_client_cancels_a_running_task_once_and_the_upstream_call_ends(proxy_url: str) -> None:
    observed = run_ts(proxy_url, "cancel", arguments={"seconds": 10}, headers=caller())
    task_id = observed["taskId"]
    assert observed["progress"], "the call never reported progress (never ran upstream?)"
    cancelled = observed["cancel"]["ok"]
    assert (cancelled["taskId"], cancelled["status"]) == (task_id, "cancelled")
    assert cancelled["statusMessage"] == "The task was cancelled by request."
    assert observed["cancelAgain"] == {
        "error": {"code": -32602, "message": TS_PREFIX + "Cannot cancel task: already in terminal status 'cancelled'"}
    }
    assert observed["pendingResult"] == {
        "error": {"code": -32602, "message": TS_PREFIX + "Task was cancelled: it has no result"}
    }
    assert observed["afterCancel"]["ok"]["status"] == "cancelled"
    assert observed["events"][-1]["type"] == "error"  # the SDK's own verdict on a cancelled task
    assert observed["events"][-1]["error"]["message"].endswith(f"Task {task_id} was cancelled")
    assert observed["checkAfter"] == observed["checkBefore"] + 1  # the modern server saw its call cancelled
    valid_tasks(cancelled, observed["afterCancel"]["ok"])


def test_ts_client_is_told_invalid_params_for_an_unknown_task(proxy_url: str) -> None:
    observed = run_ts(proxy_url, "unknown", task_id="no-such-task")
    for method in ("getTask", "getTaskResult", "cancelTask"):
        assert observed[method] == not_found(TS_PREFIX), method


def test_ts_clients_task_is_gone_after_its_ttl(proxy_url: str) -> None:
    observed = run_ts(proxy_url, "expiry", ttl=1500, deadline_ms=10000, headers=caller())
    created = observed["events"][0]["task"]
    assert created["ttl"] == 1500
    assert observed["events"][-1]["result"]["content"] == [{"type": "text", "text": "echo: short-lived"}]
    assert observed["expired"] == not_found(TS_PREFIX)
    assert observed["expiredAfterMs"] >= 1500  # not before its ttl


def test_ts_client_lists_its_own_tasks(proxy_url: str) -> None:
    observed = run_ts(proxy_url, "list", count=3, headers=caller())
    listed = observed["listed"]
    assert [t["taskId"] for t in listed["tasks"]] == observed["created"]  # oldest first, nobody else's
    assert "nextCursor" not in listed
    valid_tasks(*listed["tasks"])


def post_ping(url: str, session_id: str) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Mcp-Session-Id": session_id,
            "Mcp-Protocol-Version": REVISION,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_ts_clients_task_outlives_its_session_and_is_the_callers_alone(proxy_url: str) -> None:
    alice, bob = caller(), caller()
    made = run_ts(proxy_url, "create", headers=alice)
    task_id = made["taskId"]
    assert made["ended"]["status"] == "completed"
    assert post_ping(proxy_url, made["sessionId"]) == 404  # the session is gone (DELETE)
    again = run_ts(proxy_url, "read", task_id=task_id, headers=alice)
    assert again["sessionId"] != made["sessionId"]
    assert again["getTask"]["ok"]["status"] == "completed"
    assert again["getTaskResult"]["ok"] == {
        "content": [{"type": "text", "text": "echo: kept"}],
        "isError": False,
        "_meta": related(task_id),
    }
    other = run_ts(proxy_url, "read", task_id=task_id, headers=bob)
    assert other["getTask"] == not_found(TS_PREFIX)
    assert other["getTaskResult"] == not_found(TS_PREFIX)


# ---------------------------------------------------------------- the yardstick: a real 2025-11-25 task server


def test_ts_driver_runs_server_everythings_own_task_tool_the_same_way(everything_http: str) -> None:
    observed = run_ts(everything_http, "stream", tool="simulate-research-query", arguments={"topic": "python"})
    assert observed["serverCapabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    [tool] = [t for t in observed["tools"] if t["name"] == "simulate-research-query"]
    assert tool["execution"] == {"taskSupport": "required"}
    events = observed["events"]
    assert squeeze(stream_statuses(events)) == ["working", "completed"]
    messages = [e["task"].get("statusMessage") for e in events if "task" in e]
    assert "Gathering sources..." in messages and "Generating report..." in messages
    task_id = events[0]["task"]["taskId"]
    assert events[-1]["result"]["_meta"] == related(task_id)
    assert events[-1]["result"]["content"][0]["text"].startswith("# Research Report: python")
    valid_tasks(*(e["task"] for e in events if "task" in e))


def test_ts_driver_answers_server_everythings_elicitation_during_a_task(everything_http: str) -> None:
    observed = run_ts(
        everything_http,
        "stream",
        tool="simulate-research-query",
        arguments={"topic": "python", "ambiguous": True},
        elicit_content={"interpretation": "snake"},
    )
    events = observed["events"]
    task_id = events[0]["task"]["taskId"]
    assert squeeze(stream_statuses(events))[-1] == "input_required"
    [asked] = observed["elicitations"]
    assert asked["_meta"] == related(task_id)
    assert "interpretation" in asked["requestedSchema"]["properties"]
    assert events[-1]["result"]["content"][0]["text"].startswith("# Research Report: python (snake)")


# ---------------------------------------------------------------- the mcp 1.30 client


def test_py_client_polls_a_slow_task_and_reads_its_result_and_progress(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task", tool="slow", arguments={"seconds": 0.3}, headers=caller())
    created = observed["created"]["task"]
    task_id = created["taskId"]
    assert (created["status"], created["ttl"]) == ("working", 60000)
    assert squeeze([s["status"] for s in observed["statuses"]])[-1] == "completed"
    assert observed["result"] == {
        "content": [{"type": "text", "text": "slow done"}],
        "isError": False,
        "_meta": related(task_id),
    }
    assert observed["after"]["status"] == "completed"
    assert observed["progress"] == [
        {"progressToken": "task-progress", "progress": float(i), "total": 3.0, "message": f"step {i} of 3"}
        | {"_meta": related(task_id)}
        for i in (1, 2, 3)
    ]
    valid_tasks(created, *observed["statuses"], observed["after"])


def test_py_client_answers_the_elicitation_of_a_task_in_its_callback(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task", tool="elicit", arguments={"message": "who?"}, elicit_content={"name": "Grace"})
    task_id = observed["created"]["task"]["taskId"]
    assert observed["statuses"][-1]["status"] == "input_required"
    [asked] = observed["elicitations"]
    assert asked["message"] == "who?" and asked["_meta"] == related(task_id)
    assert observed["result"]["content"] == [{"type": "text", "text": "elicited: action=accept name=Grace"}]
    assert observed["after"]["status"] == "completed"
    told = [n["params"]["status"] for n in observed["notifications"] if n.get("method") == "notifications/tasks/status"]
    assert in_order(told, ["input_required", "working", "completed"]) and told[-1] == "completed", told


def test_py_client_cancels_a_running_task_once_and_the_upstream_call_ends(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task_cancel", arguments={"seconds": 10}, headers=caller())
    assert observed["progressed"] is True
    cancelled = observed["cancel"]["ok"]
    assert (cancelled["taskId"], cancelled["status"]) == (observed["taskId"], "cancelled")
    assert observed["cancelAgain"] == {
        "error": {"code": -32602, "message": "Cannot cancel task: already in terminal status 'cancelled'"}
    }
    assert observed["pendingResult"] == {"error": {"code": -32602, "message": "Task was cancelled: it has no result"}}
    assert observed["afterCancel"]["ok"]["status"] == "cancelled"
    assert observed["checkAfter"] == observed["checkBefore"] + 1


def test_py_client_is_told_invalid_params_for_an_unknown_task(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task_unknown", task_id="no-such-task")
    for method in ("getTask", "getTaskResult", "cancelTask"):
        assert observed[method] == not_found(), method


def test_py_clients_task_is_gone_after_its_ttl(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task_expiry", ttl=1500, deadline=10.0, headers=caller())
    assert observed["created"]["task"]["ttl"] == 1500
    assert observed["result"]["ok"]["content"] == [{"type": "text", "text": "echo: short-lived"}]
    assert observed["expired"] == not_found()


def test_py_client_lists_its_own_tasks(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task_list", count=2, headers=caller())
    assert [t["taskId"] for t in observed["listed"]["tasks"]] == observed["created"]
    assert "nextCursor" not in observed["listed"]


def test_py_clients_task_outlives_its_session_and_is_the_callers_alone(proxy_url: str) -> None:
    alice, bob = caller(), caller()
    made = run_py(proxy_url, "task_create", headers=alice)
    task_id = made["taskId"]
    assert made["statuses"][-1]["status"] == "completed"
    assert made["deleteStatus"] == 200  # the SDK ended its session
    again = run_py(proxy_url, "task_read", task_id=task_id, headers=alice)
    assert again["sessionId"] != made["sessionId"]
    assert again["getTask"]["ok"]["status"] == "completed"
    assert again["getTaskResult"]["ok"]["content"] == [{"type": "text", "text": "echo: kept"}]
    assert [t["taskId"] for t in again["listed"]["ok"]["tasks"]] == [task_id]
    other = run_py(proxy_url, "task_read", task_id=task_id, headers=bob)
    assert other["getTask"] == not_found()
    assert other["getTaskResult"] == not_found()
    assert other["listed"]["ok"]["tasks"] == []
