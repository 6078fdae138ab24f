"""Modern clients calling a legacy server's tools that run only as tasks (2025-11-25 `taskSupport:
"required"`): the proxy makes the call task-augmented and reads its `tasks/result` as the reply,
input requests on that stream included (docs/use/pairings.md, "Modern client, legacy server").
Real app, scripted legacy upstream (tests/support/fake_legacy.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.protocol import meta
from tests.integration.test_modern_to_legacy_http import (  # the fixtures of that module's legacy fake too
    ACCEPTED,
    ELICIT_PARAMS,
    SINFO,
    WAIT,
    Proxy,
    answered_after,
    fake,
    fake_server,
    input_required,
    make_proxy,
    proxy,
    respond_with,
    retry,
    tool_result,
)
from tests.support.fake_legacy import Call, FakeLegacy, Outcome
from tests.support.mcp_client import McpReply
from tests.support.modern_client import ModernClient

JSONDict = dict[str, Any]
__all__ = ["fake", "fake_server", "make_proxy", "proxy"]  # pytest finds fixtures by module name
RESEARCH = {"name": "research", "arguments": {"topic": "tides"}}
TASK_TOOL = {"name": "research", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}}
PLAIN_TOOL = {"name": "echo", "inputSchema": {"type": "object"}}
TASK = {
    "taskId": "up-task-1",
    "status": "working",
    "createdAt": "2026-12-02T00:00:00Z",
    "lastUpdatedAt": "2026-12-02T00:00:00Z",
    "ttl": 60000,
}
RELATED = {meta.RELATED_TASK: {"taskId": "up-task-1"}}


async def one_round_answered(client: ModernClient) -> tuple[JSONDict, str, McpReply]:
    """The research call with its one input round answered (ACCEPTED): the round, its key and the
    retry's reply."""
    await client.request("tools/list")
    first = input_required(await client.request("tools/call", RESEARCH))
    [key] = first["inputRequests"]
    return first, key, await client.request("tools/call", retry(RESEARCH, first["requestState"], {key: ACCEPTED}))


def task_server(fake: FakeLegacy, result: Any) -> None:
    """The fake declares tasks and lists a task-only tool; tools/call creates a task, tasks/result
    runs `result(call)` (it may ask the client through the tasks/result stream)."""
    fake.initialize_result["capabilities"]["tasks"] = {"cancel": {}, "requests": {"tools": {"call": {}}}}
    fake.tools = [TASK_TOOL, PLAIN_TOOL]

    async def tools_call(call: Call) -> Outcome:
        if "task" not in call.params:
            return {"content": [{"type": "text", "text": "requires task augmentation"}], "isError": True}
        return {"task": TASK}

    fake.handlers["tools/call"] = tools_call
    fake.handlers["tasks/result"] = result


async def test_a_task_only_tool_is_called_as_a_task_and_its_result_is_the_reply(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, respond_with({**tool_result("tides are lunar"), "_meta": dict(RELATED)}))
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        listed = await client.request("tools/list")
        reply = await client.request("tools/call", RESEARCH)
    assert [t.get("execution") for t in listed.result["tools"]] == [None, None]  # no such field in 2026-07-28
    assert reply.final == {
        "jsonrpc": "2.0",
        "id": reply.request_id,
        "result": {**tool_result("tides are lunar"), "resultType": "complete", "_meta": SINFO},
    }
    [call] = fake.calls_of("tools/call")
    assert call.params["task"] == {}
    [waited] = fake.calls_of("tasks/result")
    assert waited.params == {"taskId": "up-task-1"}
    assert waited.session_id == call.session_id  # a legacy task lives in its session


async def test_a_plain_tool_of_the_same_server_is_called_plainly(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, None)
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        await client.request("tools/list")
        reply = await client.request("tools/call", {"name": "echo", "arguments": {}})
    assert reply.result["isError"] is True  # the fake's plain answer, passed on as it is
    assert "task" not in fake.calls_of("tools/call")[0].params
    assert fake.calls_of("tasks/result") == []


async def test_input_the_task_needs_becomes_input_required_and_the_retry_resumes_it(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    async def result(call: Call) -> Outcome:
        answer = await call.ask("elicitation/create", {**ELICIT_PARAMS, "_meta": dict(RELATED)})
        return tool_result(f"researched: {answer['result']['action']}")

    task_server(fake, result)
    async with asyncio.timeout(WAIT):
        first, key, second = await one_round_answered(proxy.modern("Bearer alice"))
    assert first["inputRequests"][key]["method"] == "elicitation/create"
    assert second.result["content"] == tool_result("researched: accept")["content"]
    assert len(fake.calls_of("tools/call")) == 1 and len(fake.calls_of("tasks/result")) == 1


async def test_a_task_given_up_is_cancelled_with_tasks_cancel(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, answered_after(asyncio.Event(), None))  # never ends by itself
    fake.handlers["tasks/cancel"] = lambda call: asyncio.sleep(0, {**TASK, "status": "cancelled"})
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        await client.request("tools/list")
        pending = asyncio.create_task(client.request("tools/call", RESEARCH))
        await fake.next_call("tasks/result")
        pending.cancel()  # the client goes away: in 2026-07-28 that is the cancellation
        cancelled = await fake.next_call("tasks/cancel")
    assert cancelled.params == {"taskId": "up-task-1"}
    assert all(c.method != "notifications/cancelled" for c in fake.calls)


async def test_a_client_that_never_listed_the_tools_gets_the_task_only_tool_called_as_a_task(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    task_server(fake, respond_with(tool_result("done")))
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        first = await client.request("tools/call", RESEARCH)
        again = await client.request("tools/call", RESEARCH)
    assert first.result["content"] == again.result["content"] == tool_result("done")["content"]
    assert len(fake.calls_of("tools/list")) == 1  # the proxy walked the list once, before the first call
    assert [c.params.get("task") for c in fake.calls_of("tools/call")] == [{}, {}]


async def test_a_question_the_server_asks_before_it_makes_the_task_is_an_input_round_too(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    task_server(fake, respond_with(tool_result("researched")))
    asked: list[JSONDict] = []

    async def tools_call(call: Call) -> Outcome:
        asked.append(await call.ask("elicitation/create", ELICIT_PARAMS))  # on the call's own stream
        return {"task": TASK}

    fake.handlers["tools/call"] = tools_call
    async with asyncio.timeout(WAIT):
        _, _, second = await one_round_answered(proxy.modern("Bearer alice"))
    assert [a["result"] for a in asked] == [ACCEPTED]
    assert second.result["content"] == tool_result("researched")["content"]
    assert len(fake.calls_of("tasks/result")) == 1
