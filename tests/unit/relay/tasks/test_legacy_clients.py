"""The tasks of legacy clients of a modern upstream: the hosted 2025-11-25 tasks' requests and the
tasks/cancel of abandoned upstream tasks (proxy/relay/tasks/legacy_clients.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from proxy.protocol import jsonrpc
from proxy.protocol.forwarded_call import Finish, SendUpstream
from proxy.relay.channel import NO_STREAM
from proxy.relay.tasks.legacy_clients import HostedTasks, UpstreamTaskCancels

JSONDict = dict[str, Any]
WAIT = 5.0
TASKS = "2025-11-25"
CONFIG: Any = SimpleNamespace(mark_tools=True)
SESSION: Any = SimpleNamespace(principal="alice", legacy_version=TASKS)
TASKED_CALL = jsonrpc.request(3, "tools/call", {"name": "slow", "arguments": {}, "task": {"ttl": 60000}})


class Host:
    """A task host that records what it was asked and runs a created task's call at once."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.ran: list[JSONDict] = []

    async def create(self, principal: str, message: JSONDict, run: Any, notify: Any = None) -> JSONDict:
        self.ran.append(await run(NO_STREAM))
        return jsonrpc.result_response(message["id"], {"task": {"taskId": "t1"}})

    async def get(self, principal: str, message: JSONDict) -> JSONDict:
        self.asked.append(("get", principal))
        return jsonrpc.result_response(message["id"], {})

    async def result(self, principal: str, message: JSONDict, channel: Any) -> JSONDict:
        self.asked.append(("result", principal))
        return jsonrpc.result_response(message["id"], {})

    async def cancel(self, principal: str, message: JSONDict) -> JSONDict:
        self.asked.append(("cancel", principal))
        return jsonrpc.result_response(message["id"], {})

    async def list(self, principal: str, message: JSONDict) -> JSONDict:
        self.asked.append(("list", principal))
        return jsonrpc.result_response(message["id"], {})


async def no_call(message: JSONDict, channel: Any) -> Finish:
    raise AssertionError("a call ran")


def test_only_sessions_of_a_revision_with_tasks_come_here_and_only_when_tasks_are_hosted() -> None:
    hosted = HostedTasks(Host(), CONFIG)
    assert hosted.hosting and hosted.serves(TASKS) and not hosted.serves("2025-06-18")
    unhosted = HostedTasks(None, CONFIG)
    assert not unhosted.hosting and not unhosted.serves(TASKS)


async def test_each_tasks_method_goes_to_the_host_for_the_sessions_caller() -> None:
    host = Host()
    hosted = HostedTasks(host, CONFIG)
    for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list"):
        message = jsonrpc.request(1, method, {"taskId": "t1"})
        await hosted.request(SESSION, message, NO_STREAM, lambda note: None, no_call)
    assert host.asked == [("get", "alice"), ("result", "alice"), ("cancel", "alice"), ("list", "alice")]


async def test_a_task_augmented_call_runs_without_its_task_and_ends_with_the_requests_reply() -> None:
    host, calls = Host(), []

    async def run_call(message: JSONDict, channel: Any) -> Finish:
        calls.append(message)
        return Finish(result={"content": []})

    hosted = HostedTasks(host, CONFIG)
    reply = await hosted.request(SESSION, TASKED_CALL, NO_STREAM, lambda note: None, run_call)
    assert reply["result"] == {"task": {"taskId": "t1"}}
    assert "task" not in calls[0]["params"] and calls[0]["params"]["name"] == "slow"
    assert host.ran[0]["id"] == 3 and host.ran[0]["result"]["content"] == []


def test_only_tasks_methods_and_task_augmented_calls_are_taken_a_plain_call_goes_straight_on() -> None:
    hosted = HostedTasks(Host(), CONFIG)
    assert hosted.takes(SESSION, jsonrpc.request(1, "tasks/get", {"taskId": "t1"}))
    assert hosted.takes(SESSION, TASKED_CALL)
    assert not hosted.takes(SESSION, jsonrpc.request(1, "tools/call", {"name": "slow", "arguments": {}}))
    assert not hosted.takes(SESSION, jsonrpc.request(1, "tools/list", {}))
    older = SimpleNamespace(**{**vars(SESSION), "legacy_version": "2025-06-18"})
    assert not hosted.takes(older, TASKED_CALL)
    assert not HostedTasks(None, CONFIG).takes(SESSION, TASKED_CALL)


def test_a_forwarded_tools_list_marks_every_tool_as_task_capable_and_nothing_else_is_touched() -> None:
    tools = jsonrpc.result_response(1, {"tools": [{"name": "a", "inputSchema": {"type": "object"}}]})
    marked = HostedTasks(Host(), CONFIG).listed(SESSION, "tools/list", tools)
    assert marked["result"]["tools"][0]["execution"] == {"taskSupport": "optional"}
    assert "execution" not in tools["result"]["tools"][0]  # the upstream's reply is not changed in place
    unmarked = HostedTasks(Host(), SimpleNamespace(mark_tools=False)).listed(SESSION, "tools/list", tools)
    assert "execution" not in unmarked["result"]["tools"][0]
    assert HostedTasks(Host(), CONFIG).listed(SESSION, "prompts/list", tools) is tools
    assert HostedTasks(None, CONFIG).listed(SESSION, "tools/list", tools) is tools


class Upstream:
    """An upstream that answers a tasks/cancel with `reply`, or never (None)."""

    name = "up"

    def __init__(self, reply: JSONDict | None) -> None:
        self.reply = reply
        self.sent: list[tuple[JSONDict, dict[str, str]]] = []

    @asynccontextmanager
    async def exchange(self, message: JSONDict, headers: dict[str, str]) -> AsyncIterator[AsyncIterator[JSONDict]]:
        self.sent.append((message, headers))

        async def messages() -> AsyncIterator[JSONDict]:
            if self.reply is None:
                await asyncio.Event().wait()
            yield jsonrpc.notification("notifications/progress", {})
            assert self.reply is not None
            yield self.reply

        yield messages()


CANCEL = SendUpstream(
    jsonrpc.request("c1.cancel", "tasks/cancel", {"taskId": "up-task"}), {"Mcp-Method": "tasks/cancel"}
)


async def test_an_abandoned_upstream_task_is_cancelled_with_the_callers_credentials() -> None:
    upstream = Upstream(jsonrpc.result_response("c1.cancel", {}))
    cancels = UpstreamTaskCancels(upstream)
    with capture_logs() as logs:
        cancels.spawn(CANCEL, {"authorization": "Bearer t"})
        await cancels.settle(WAIT)
    assert upstream.sent == [(CANCEL.message, {"authorization": "Bearer t", "Mcp-Method": "tasks/cancel"})]
    assert [e["event"] for e in logs] == ["upstream_task_cancelled"]
    assert "up-task" not in str(logs)  # logs name the task by a short hash only


async def test_a_refused_or_unanswered_cancel_is_reported_not_raised() -> None:
    refused = UpstreamTaskCancels(Upstream(jsonrpc.error_response("c1.cancel", -32602, "no such task")))
    silent = UpstreamTaskCancels(Upstream(None), within_s=0.0)
    with capture_logs() as logs:
        refused.spawn(CANCEL, {})
        silent.spawn(CANCEL, {})
        await refused.settle(WAIT)
        await silent.settle(WAIT)
    assert [e["event"] for e in logs] == ["upstream_task_cancel_failed"] * 2


async def test_after_settling_no_cancel_starts() -> None:
    upstream = Upstream(jsonrpc.result_response("c1.cancel", {}))
    cancels = UpstreamTaskCancels(upstream)
    await cancels.settle(WAIT)
    cancels.spawn(CANCEL, {})
    await cancels.settle(WAIT)
    assert upstream.sent == []
