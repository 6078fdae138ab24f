"""Legacy clients of a 2026-07-28 server that runs calls as tasks of the `io.modelcontextprotocol/tasks`
extension: the proxy declares the extension upstream and follows the task, so the legacy client sees
the call's outcome (docs/use/tasks.md; io.modelcontextprotocol/tasks extension
(specification/draft/tasks.md)). The server is the project's own fixture on mcp 2.3
(tests/e2e/peers/modern_task_server.py); the client is mcp 1.30 (tests/e2e/peers/legacy_client.py),
calling plainly and as a task the proxy hosts. As a yardstick, a raw modern client straight to the
fixture shows it answers with a task only when the request declares the extension, in the shapes
of the extension's schema."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import ProxyFactory
from tests.e2e.test_tasks_e2e import run_tagged, run_ts
from tests.support import peers
from tests.support.procs import serving
from tests.support.schema import ext_tasks_errors
from tests.support.sdk_drivers import legacy_client_argv

pytestmark = pytest.mark.e2e

TASKS = "io.modelcontextprotocol/tasks"
MODERN = "2026-07-28"
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def task_server(logs_dir: Any) -> Iterator[str]:
    argv = [str(peers.mcp2_python()), str(peers.PEER_SCRIPTS / "modern_task_server.py"), "--port", "0"]
    with serving(argv, logs_dir / "modern-task-server.log") as server:
        yield f"http://127.0.0.1:{server.port}/mcp"


@pytest.fixture(scope="module")
def proxy_url(start_proxy: ProxyFactory, task_server: str) -> Iterator[str]:
    with start_proxy(task_server) as url:
        yield url


def raw(url: str, method: str, params: dict[str, Any], *, declare: bool = True, name: str | None = None) -> Any:
    """One 2026-07-28 request straight to the fixture: (HTTP status, JSON-RPC message)."""
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if declare else {}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": method,
        "params": {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": capabilities,
                "io.modelcontextprotocol/clientInfo": {"name": "raw-yardstick", "version": "1"},
            },
        },
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    if text.lstrip().startswith("event:") or text.lstrip().startswith("data:"):
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    return status, json.loads(text)


def counts(task_server: str) -> dict[str, int]:
    _, reply = raw(
        task_server, "tools/call", {"name": "task_counts", "arguments": {}}, declare=False, name="task_counts"
    )
    return json.loads(reply["result"]["content"][0]["text"])


def polled(url: str, task_id: str, wanted: str) -> dict[str, Any]:
    """tasks/get until the task is `wanted` (bounded), each answer checked against the schema."""
    deadline = time.monotonic() + 10
    while True:
        status, reply = raw(url, "tasks/get", {"taskId": task_id}, name=task_id)
        assert status == 200 and ext_tasks_errors("GetTaskResult", reply["result"]) == [], reply
        if reply["result"]["status"] == wanted:
            return dict(reply["result"])
        assert time.monotonic() < deadline, reply
        time.sleep(0.05)  # polling cadence, bounded by the deadline


def created_task(url: str, tool: str, arguments: dict[str, Any] | None = None) -> str:
    status, created = raw(url, "tools/call", {"name": tool, "arguments": arguments or {}}, name=tool)
    assert status == 200 and ext_tasks_errors("CreateTaskResult", created["result"]) == [], created
    return str(created["result"]["taskId"])


def run_py(url: str, scenario: str, **args: Any) -> dict[str, Any]:
    return run_tagged(legacy_client_argv(url, scenario, args, TIMEOUT_S), {}, TIMEOUT_S)


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result["content"])


def test_the_fixture_answers_with_a_task_only_to_a_request_that_declares_the_extension(task_server: str) -> None:
    call = {"name": "slow_task", "arguments": {"seconds": 0.2}}
    status, plain = raw(task_server, "tools/call", call, declare=False, name="slow_task")
    assert status == 200 and plain["result"]["resultType"] == "complete"
    assert text_of(plain["result"]) == "slow done after 0.2s"
    status, created = raw(task_server, "tools/call", call, name="slow_task")
    assert status == 200 and created["result"]["resultType"] == "task"
    assert ext_tasks_errors("CreateTaskResult", created["result"]) == []
    task_id = created["result"]["taskId"]
    status, got = raw(task_server, "tasks/get", {"taskId": task_id}, name=task_id)
    assert status == 200 and ext_tasks_errors("GetTaskResult", got["result"]) == []
    status, refused = raw(task_server, "tasks/get", {"taskId": task_id}, declare=False, name=task_id)
    assert (status, refused["error"]["code"]) == (400, -32021)
    status, mismatch = raw(task_server, "tasks/get", {"taskId": task_id}, name="another")
    assert (status, mismatch["error"]["code"]) == (400, -32020)


def test_the_fixtures_tasks_have_the_shapes_of_the_extensions_schema(task_server: str) -> None:
    asking = created_task(task_server, "ask_task")
    waiting = polled(task_server, asking, "input_required")
    assert list(waiting["inputRequests"]) == ["name"]
    answer = {"name": {"action": "accept", "content": {"name": "Luca"}}}
    _, ack = raw(task_server, "tasks/update", {"taskId": asking, "inputResponses": answer}, name=asking)
    assert ext_tasks_errors("UpdateTaskResult", ack["result"]) == []
    assert text_of(polled(task_server, asking, "completed")["result"]) == "hello Luca (accept)"
    failing = created_task(task_server, "failing_task")
    assert polled(task_server, failing, "failed")["error"] == {"code": -32603, "message": "the job blew up"}
    running = created_task(task_server, "slow_task", {"seconds": 30})
    _, ack = raw(task_server, "tasks/cancel", {"taskId": running}, name=running)
    assert ext_tasks_errors("CancelTaskResult", ack["result"]) == []
    polled(task_server, running, "cancelled")


def test_a_plain_call_of_a_task_tool_gets_the_tasks_result(proxy_url: str, task_server: str) -> None:
    before = counts(task_server)
    observed = run_py(proxy_url, "tools", tool="slow_task", arguments={"seconds": 0.3})
    assert "error" not in observed, observed
    assert text_of(observed["result"]) == "slow done after 0.3s"
    after = counts(task_server)
    assert after["created"] == before["created"] + 1  # it ran as the upstream's task, not plainly
    assert after["gets"] > before["gets"] and after["name_mismatches"] == before["name_mismatches"]


def test_elicitation_during_the_upstream_task_is_answered_by_the_legacy_client(proxy_url: str) -> None:
    observed = run_py(proxy_url, "elicitation", tool="ask_task", arguments={}, elicit_content={"name": "Luca"})
    assert "error" not in observed, observed
    [asked] = observed["elicitations"]
    assert asked["message"] == "What is your name?"
    assert text_of(observed["result"]) == "hello Luca (accept)"


def test_a_failed_upstream_task_is_the_legacy_clients_error(proxy_url: str, task_server: str) -> None:
    before = counts(task_server)["created"]
    observed = run_py(proxy_url, "tools", tool="failing_task", arguments={})
    assert "the job blew up" in json.dumps(observed["error"]), observed
    assert counts(task_server)["created"] == before + 1  # the error came from the task


def test_an_upstream_task_that_expires_fails_the_call_saying_so(proxy_url: str) -> None:
    observed = run_py(proxy_url, "tools", tool="short_lived_task", arguments={})
    assert "no longer knows the task" in json.dumps(observed["error"]), observed


def test_a_plain_call_the_client_cancels_cancels_the_upstream_task(proxy_url: str) -> None:
    observed = run_py(
        proxy_url,
        "cancel",
        tool="slow_task",
        arguments={"seconds": 30},
        check_tool="cancel_count",
        started_tool="created_count",
    )
    assert "error" not in observed, observed
    assert observed["checkAfter"] == observed["checkBefore"] + 1


def test_a_hosted_task_follows_the_upstream_task_to_its_result(proxy_url: str, task_server: str) -> None:
    before = counts(task_server)["created"]
    observed = run_py(proxy_url, "task", tool="slow_task", arguments={"seconds": 0.3})
    assert "error" not in observed, observed
    assert text_of(observed["result"]) == "slow done after 0.3s"
    assert observed["after"]["status"] == "completed"
    assert counts(task_server)["created"] == before + 1


def test_a_hosted_task_asks_the_legacy_client_for_the_upstream_tasks_input(proxy_url: str) -> None:
    observed = run_py(proxy_url, "task", tool="ask_task", arguments={}, elicit_content={"name": "Ada"})
    assert "error" not in observed, observed
    assert [e["message"] for e in observed["elicitations"]] == ["What is your name?"]
    assert text_of(observed["result"]) == "hello Ada (accept)"


def test_cancelling_a_hosted_task_cancels_the_upstream_task(proxy_url: str) -> None:
    observed = run_py(
        proxy_url,
        "task_cancel",
        tool="slow_task",
        arguments={"seconds": 30},
        check_tool="cancel_count",
        started_tool="created_count",
    )
    assert "error" not in observed, observed
    assert observed["progressed"] is True
    assert observed["cancel"]["ok"]["status"] == "cancelled"
    assert observed["checkAfter"] == observed["checkBefore"] + 1


# The TypeScript SDK v1's 2025-11-25 task client (`callToolStream`, which decides by the tool list
# whether to make a task: the proxy lists every tool as one that may run as a task).


def test_the_typescript_clients_task_streams_to_the_upstream_tasks_result(proxy_url: str, task_server: str) -> None:
    before = counts(task_server)["created"]
    observed = run_ts(proxy_url, "stream", tool="slow_task", arguments={"seconds": 0.3}, ttl=60_000)
    kinds = [event["type"] for event in observed["events"]]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", observed["events"]
    assert text_of(observed["events"][-1]["result"]) == "slow done after 0.3s"
    assert counts(task_server)["created"] == before + 1  # the proxy's task followed the upstream's
    ended = [n for n in observed["statusNotifications"] if n["status"] == "completed"]
    assert ended and ended[-1]["taskId"] == observed["events"][0]["task"]["taskId"]


def test_the_typescript_client_answers_the_upstream_tasks_question_during_its_task(proxy_url: str) -> None:
    observed = run_ts(proxy_url, "stream", tool="ask_task", arguments={}, ttl=60_000)
    assert [e["message"] for e in observed["elicitations"]] == ["What is your name?"]
    assert text_of(observed["events"][-1]["result"]) == "hello Ada (accept)"  # the driver's answer
