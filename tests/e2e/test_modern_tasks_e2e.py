"""A real 2026-07-28 client of the `io.modelcontextprotocol/tasks` extension, through the proxy, in
front of server-everything's 2025-11-25 task tool `simulate-research-query`: the mcp 2.3 SDK with
its own extension hooks (tests/e2e/peers/modern_task_client.py: a ClientExtension whose
ResultClaim takes the `resultType: "task"` handle, tasks/get, tasks/update and tasks/cancel as
custom Request models sent with `send_request`, a NotificationBinding for `notifications/tasks`).
Every message the client got is checked against the 2026-07-28 schema and the extension's own
(tests/schemas/schema-ext-tasks.json). A recording tap between the proxy and server-everything
shows what the server was asked and answered, and the server's log what its task did after a
cancel. As a yardstick the same client straight against server-everything cannot use the tool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ProxyFactory
from tests.support.procs import wait_for
from tests.support.schema import server_message_errors
from tests.support.sdk_drivers import run_modern_task_client
from tests.support.tap import read_record

pytestmark = pytest.mark.e2e

# simulate-research-query's stages (its task's statusMessage while it works)
STAGES = ("Gathering sources", "Analyzing content", "Synthesizing findings", "Generating report")
EXTENSION = "io.modelcontextprotocol/tasks"
REVISION = "2026-07-28"
TOOL = "simulate-research-query"
NOT_FOUND = "Failed to retrieve task: Task not found"
TIMEOUT_S = 40.0
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")

Observed = dict[str, Any]


@pytest.fixture(scope="module")
def upstream_tap(
    everything_http: str, tap_factory: Callable[..., AbstractContextManager[tuple[str, Path]]]
) -> Iterator[tuple[str, Path]]:
    """A recording tap in front of server-everything: (url, record of what the proxy sent and got)."""
    with tap_factory(everything_http) as tapped:
        yield tapped


@pytest.fixture(scope="module")
def proxy_url(start_proxy: ProxyFactory, upstream_tap: tuple[str, Path]) -> Iterator[str]:
    with start_proxy(upstream_tap[0]) as url:  # era detected (auto)
        yield url


def run(url: str, scenario: str, args: dict[str, Any] | None = None) -> Observed:
    observed = run_modern_task_client(url, scenario, args, timeout=TIMEOUT_S)
    assert "error" not in observed and observed["_exit"] == 0, observed
    return observed


def is_task_message(message: dict[str, Any], method: str | None) -> bool:
    """A message of the extension's: a task handle, a reply to tasks/*, a task notification."""
    if message.get("method") == "notifications/tasks":
        return True
    result = message.get("result")
    if not isinstance(result, dict):
        return False
    return method in TASK_METHODS or (method == "tools/call" and result.get("resultType") == "task")


def checked_task_messages(observed: Observed) -> int:
    """Every message the client got is valid 2026-07-28 (and the extension's, for task messages);
    returns how many task messages there were."""
    problems: list[str] = []
    tasks = 0
    for exchange in observed["wire"]:
        for message in exchange["messages"]:
            method = exchange["rpc"] if message.get("id") == exchange["rpcId"] else None
            tasks += is_task_message(message, method)
            for problem in server_message_errors(REVISION, message, method):
                problems.append(f"{problem} in {json.dumps(message)[:300]}")
    assert problems == [], problems[:10]
    return tasks


def posts(observed: Observed, rpc: str) -> list[dict[str, Any]]:
    return [exchange for exchange in observed["wire"] if exchange["rpc"] == rpc]


def report(result: dict[str, Any]) -> str:
    [text] = [block["text"] for block in result["content"] if block.get("type") == "text"]
    return text


def upstream_exchanges(record: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """What the proxy asked server-everything, each request with the messages its exchange got."""
    requests: dict[int, dict[str, Any]] = {}
    replies: dict[int, list[dict[str, Any]]] = {}
    for entry in read_record(record):
        message = entry["message"]
        if entry["dir"] == "to_server" and isinstance(message, dict) and "method" in message and "id" in message:
            requests[entry["exchange"]] = message
        elif entry["dir"] == "to_client" and isinstance(message, dict):
            replies.setdefault(entry["exchange"], []).append(message)
    return [(requests[n], replies.get(n, [])) for n in sorted(requests)]


def upstream_tasks_created(record: Path) -> list[str]:
    """The ids of the tasks server-everything created for the proxy's task-augmented calls."""
    created = []
    for request, replies in upstream_exchanges(record):
        if request["method"] == "tools/call" and "task" in request["params"]:
            for reply in replies:
                task = (reply.get("result") or {}).get("task")
                if reply.get("id") == request["id"] and isinstance(task, dict):
                    created.append(task["taskId"])
    return created


def upstream_cancels(record: Path) -> dict[str, str | None]:
    """Upstream task id -> the status server-everything's reply to the proxy's tasks/cancel gave."""
    cancels: dict[str, str | None] = {}
    for request, replies in upstream_exchanges(record):
        if request["method"] == "tasks/cancel":
            answers = [r for r in replies if r.get("id") == request["id"]]
            status = (answers[0].get("result") or {}).get("status") if answers else None
            cancels[request["params"]["taskId"]] = status
    return cancels


def server_log_line(log: Path, needle: str, wait_s: float) -> str | None:
    """The first line of server-everything's log containing `needle`, read until it shows up
    (bounded): its task notices a cancel at the next stage of its work, a second at most."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [line for line in log.read_text(errors="replace").splitlines() if needle in line]
        if found or time.monotonic() > deadline:
            return found[0] if found else None
        time.sleep(0.1)


# ---------------------------------------------------------------------------- the yardstick


@pytest.mark.parametrize("mode", ["auto", REVISION])
def test_straight_against_server_everything_the_same_client_cannot_use_its_task_tool(everything_http: str, mode: str):
    observed = run_modern_task_client(everything_http, "task", {"mode": mode}, timeout=TIMEOUT_S)
    assert observed.get("handle") is None and observed.get("polls", []) == []
    if mode == "auto":  # falls back to initialize: 2025-11-25, where the extension's claim is inactive
        assert observed["_exit"] == 0 and observed["connectedVia"] == "initialize", observed
        assert observed["protocolVersion"] == "2025-11-25"
        assert observed["result"]["isError"] is True
        assert "requires task augmentation" in report(observed["result"])
        [call] = posts(observed, "tools/call")
        assert call["reqExtensions"] is None  # nothing declares it on the 2025-11-25 wire
    else:  # the 2026-07-28 wire itself is refused by the 2025-11-25 server
        assert observed["errorData"]["code"] == -32000, observed
        [call] = posts(observed["observed"], "tools/call")
        assert call["status"] == 400


# ---------------------------------------------------------------------------- through the proxy


def test_the_call_becomes_a_task_polled_to_the_report(proxy_url: str, upstream_tap: tuple[str, Path]):
    before = upstream_tasks_created(upstream_tap[1])
    observed = run(proxy_url, "task")
    handle = observed["handle"]
    assert observed["claimed"] is True and observed["connectedVia"] == "adopted"
    assert handle["resultType"] == "task" and handle["status"] == "working"
    assert isinstance(handle["ttlMs"], int) and isinstance(handle["pollIntervalMs"], int)
    statuses = [poll["status"] for poll in observed["polls"]]
    assert statuses[-1] == "completed" and set(statuses[:-1]) <= {"working"}, statuses
    # While it runs, server-everything's own task says which stage it is at.
    stages = {poll["statusMessage"] for poll in observed["polls"][:-1]} - {None}
    assert stages and stages <= {f"{stage}..." for stage in STAGES}, stages
    assert report(observed["result"]).startswith("# Research Report: tides")
    assert observed["result"]["isError"] is False
    [call] = posts(observed, "tools/call")
    assert call["reqExtensions"] == {EXTENSION: {}}  # declared by the SDK, from the ClientExtension
    gets = posts(observed, "tasks/get")
    assert len(gets) == len(statuses)
    assert {(g["reqMcpName"], g["status"]) for g in gets} == {(handle["taskId"], 200)}
    assert checked_task_messages(observed) == 1 + len(gets)
    # Upstream: one new task of server-everything's backs it, under an id of its own.
    created = upstream_tasks_created(upstream_tap[1])[len(before) :]
    assert len(created) == 1 and created[0] != handle["taskId"]


def test_the_ambiguous_query_asks_through_the_task_and_the_answer_shapes_the_report(proxy_url: str):
    args = {"arguments": {"topic": "python", "ambiguous": True}, "elicit_content": {"interpretation": "snake"}}
    observed = run(proxy_url, "task", args)
    polls = observed["polls"]
    asking = [poll for poll in polls if poll["status"] == "input_required"]
    assert asking, polls
    [(key, method)] = asking[0]["inputRequests"].items()  # one entry: the elicitation
    assert method == "elicitation/create"
    assert all(poll["inputRequests"] == {key: method} for poll in asking)  # the same key until answered
    assert observed["updates"] == [{"sent": [key], "ack": {"resultType": "complete"}}]
    [asked] = observed["callbacks"]
    assert "could have multiple interpretations" in asked["params"]["message"]
    statuses = [poll["status"] for poll in polls]
    assert statuses[-1] == "completed"
    assert "input_required" not in statuses[statuses.index("input_required") + len(asking) :]
    assert report(observed["result"]).startswith("# Research Report: python (snake)")
    [update] = posts(observed, "tasks/update")
    assert (update["reqMcpName"], update["status"]) == (observed["handle"]["taskId"], 200)
    assert checked_task_messages(observed) == 1 + len(polls) + 1


@pytest.mark.parametrize("poll_first", [True, False], ids=["while-it-runs", "at-once"])
def test_a_cancel_mid_run_is_acknowledged_and_cancels_server_everythings_task(
    proxy_url: str, upstream_tap: tuple[str, Path], logs_dir: Path, poll_first: bool
):
    # "at-once": before the proxy may even have the server's own task (its answer was still coming).
    record = upstream_tap[1]
    before = upstream_tasks_created(record)
    observed = run(proxy_url, "cancel", {"poll_first": poll_first})
    assert observed["runningBeforeCancel"] == ("working" if poll_first else None)
    assert observed["cancel"] == observed["cancelAgain"] == {"result": {"resultType": "complete"}}
    assert observed["after"] == ["cancelled"]
    assert observed["final"]["status"] == "cancelled" and "result" not in observed["final"]
    cancels = posts(observed, "tasks/cancel")
    assert {(c["reqMcpName"], c["status"]) for c in cancels} == {(observed["handle"]["taskId"], 200)}
    assert checked_task_messages(observed) >= 4
    # The server's side: its task was cancelled with tasks/cancel, it said so, and its work stopped
    # there (the next stage could not move the cancelled task on).
    # The client's cancel is acknowledged at once; the proxy's task-augmented call and its own
    # tasks/cancel to the server go on beside it ("at-once": the server's answer naming its task may
    # still be on its way), so both may reach the record a moment later.
    created = wait_for(lambda: upstream_tasks_created(record)[len(before) :], 10.0)
    assert len(created) == 1, created
    [upstream] = created
    cancelled = wait_for(lambda: upstream_cancels(record).get(upstream), 10.0)
    assert cancelled == "cancelled", upstream_cancels(record)
    needle = f'Cannot update task "{upstream}" from terminal status "cancelled"'
    stopped = server_log_line(logs_dir / "everything-http.log", needle, wait_s=10.0)
    assert stopped is not None and stopped.startswith(f"Research task {upstream} failed")


def test_ids_never_issued_are_not_found(proxy_url: str):
    observed = run(proxy_url, "unknown", {"task_id": "no-such-task"})
    for method in TASK_METHODS:
        assert observed["errors"][method]["code"] == -32602, observed["errors"]
        assert observed["errors"][method]["message"] == NOT_FOUND
        assert observed["statuses"][method] == 200
        [sent] = posts(observed, method)
        assert sent["reqMcpName"] == "no-such-task"
    checked_task_messages(observed)


def test_a_client_without_the_extension_gets_the_report_itself_and_no_task(proxy_url: str):
    observed = run(proxy_url, "plain")
    [call] = posts(observed, "tools/call")
    assert call["reqExtensions"] is None
    assert observed["result"]["resultType"] == "complete" and observed["result"]["isError"] is False
    assert report(observed["result"]).startswith("# Research Report: tides")
    assert observed["getStatus"] == 400
    assert observed["getError"] == {
        "code": -32021,
        "message": "Missing required client capability",
        "data": {"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
    }
    assert checked_task_messages(observed) == 0


def test_a_listen_for_the_task_gets_its_completion_as_notifications_tasks(proxy_url: str):
    # Client.listen() takes no taskIds: the driver sends the SDK's SubscriptionsListenRequest, its
    # filter carrying the extension's key, and the NotificationBinding gets notifications/tasks.
    observed = run(proxy_url, "listen")
    task_id = observed["handle"]["taskId"]
    ack = observed["ack"]
    assert ack is not None and ack["notifications"] == {"taskIds": [task_id]}
    subscription = ack["_meta"]["io.modelcontextprotocol/subscriptionId"]
    notes = observed["taskNotifications"]
    assert notes and notes[-1]["status"] == "completed", notes
    assert {n["taskId"] for n in notes} == {task_id}
    assert all(n["_meta"] == {"io.modelcontextprotocol/subscriptionId": subscription} for n in notes)
    assert report(notes[-1]["result"]).startswith("# Research Report: tides")
    [listen] = posts(observed, "subscriptions/listen")
    assert listen["reqExtensions"] == {EXTENSION: {}} and listen["status"] == 200
    assert [m.get("method") for m in listen["messages"]][:1] == ["notifications/subscriptions/acknowledged"]
    assert checked_task_messages(observed) == 1 + len(notes)


def test_a_task_is_gone_once_its_retention_passed(start_proxy: ProxyFactory, everything_http: str):
    # The proxy keeps its tasks for tasks.default_ttl_s (no request sets a ttl in 2026-07-28): set
    # a little past the report's ~4 s for this proxy.
    with start_proxy(everything_http, tasks__default_ttl_s="8") as url:
        observed = run(url, "expire")
    assert observed["handle"]["ttlMs"] == 8000
    assert "completed" in observed["polls"], observed["polls"]  # it ended, and was kept, first
    assert observed["goneError"]["code"] == -32602 and observed["goneError"]["message"] == NOT_FOUND
    checked_task_messages(observed)
