"""Tasks the proxy hosts for 2025-11-25 clients of a 2026-07-28 upstream, through the real app to a
scripted modern server (docs/design.md §Tasks; 2025-11-25/basic/utilities/tasks.mdx). Every reply
is checked against the 2025-11-25 schema of its method."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from tests.integration.conftest import FakeClock, MakeProxy, Proxy
from tests.integration.test_legacy_to_modern_http import ANSWERS, ELICIT, drive, scripted
from tests.support.fake_modern import Call, FakeModern, complete, error, input_required, notification
from tests.support.legacy_client import LegacyClient, read_reply
from tests.support.mcp_client import SseReader

JSONDict = dict[str, Any]
WAIT = 5.0
RELATED = meta.RELATED_TASK
TEXT = [{"type": "text", "text": "found it"}]


def gated(gate: asyncio.Event, outcome: Any) -> Any:
    """A tools/call handler that answers `outcome` once the test opens `gate`."""

    async def handler(call: Call) -> Any:
        await gate.wait()
        return outcome

    return handler


async def create(peer: LegacyClient, name: str = "research", task: JSONDict | None = None) -> JSONDict:
    reply = await peer.request("tools/call", {"name": name, "arguments": {"q": "x"}, "task": task or {}})
    assert reply.status == 200, reply.messages
    return reply.result["task"]


async def status_of(peer: LegacyClient, task_id: str) -> str:
    reply = await peer.request("tasks/get", {"taskId": task_id})
    return reply.result["status"]


async def until_status(peer: LegacyClient, task_id: str, wanted: str) -> None:
    while (status := await status_of(peer, task_id)) != wanted:
        assert status not in ("completed", "failed", "cancelled"), status
        await asyncio.sleep(0.02)


async def test_a_2025_11_25_client_is_told_the_proxy_hosts_tasks_an_older_one_is_not(proxy: Proxy) -> None:
    async with asyncio.timeout(WAIT):
        latest = await proxy.connect("2025-11-25")
        older = await proxy.connect("2025-06-18")
    assert latest.initialize_result["capabilities"]["tasks"] == {
        "list": {},
        "cancel": {},
        "requests": {"tools": {"call": {}}},
    }
    assert "tasks" not in older.initialize_result["capabilities"]


async def test_every_tool_is_listed_as_one_that_may_run_as_a_task(peer: LegacyClient, fake: FakeModern) -> None:
    fake.tools = [{"name": "research", "inputSchema": {"type": "object"}}]
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/list")
    assert reply.result["tools"] == [
        {"name": "research", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}}
    ]


async def test_with_mark_tools_off_tool_lists_are_the_upstreams_and_a_task_asked_for_still_runs(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.tools = [{"name": "research", "inputSchema": {"type": "object"}}]
    fake.handlers["tools/call"] = scripted(complete(content=TEXT))
    proxy = await make_proxy(**{"tasks.mark_tools": False})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        listed = await peer.request("tools/list")
        task = await create(peer)
        result = await peer.request("tasks/result", {"taskId": task["taskId"]})
    assert listed.result == {"tools": fake.tools}
    assert result.result["content"] == TEXT


async def test_a_task_is_answered_at_once_and_its_result_is_the_calls_tagged_with_the_task(
    peer: LegacyClient, fake: FakeModern
) -> None:
    gate = asyncio.Event()
    fake.handlers["tools/call"] = gated(gate, complete(content=TEXT))
    async with asyncio.timeout(WAIT):
        task = await create(peer, task={"ttl": 60_000})
        assert (task["status"], task["ttl"], task["pollInterval"]) == ("working", 60_000, 1000)
        [upstream] = [await fake.next_call("tools/call")]
        assert "task" not in upstream.params and upstream.params["name"] == "research"
        assert await status_of(peer, task["taskId"]) == "working"
        request_id, response = await peer.send("tasks/result", {"taskId": task["taskId"]})
        gate.set()
        reply = await read_reply(response, peer.version, "tasks/result", request_id)
        assert await status_of(peer, task["taskId"]) == "completed"
    assert reply.result == {"content": TEXT, "_meta": {RELATED: {"taskId": task["taskId"]}}}


async def test_progress_of_a_task_that_ended_before_any_tasks_result_comes_on_the_first_one(
    peer: LegacyClient, fake: FakeModern
) -> None:
    """The TypeScript SDK's callToolStream polls tasks/get until the task ended, and only then
    opens tasks/result: the progress the call made meanwhile is held for it, not dropped."""

    async def call_tool(call: Call) -> Any:
        token = call.params["_meta"]["progressToken"]
        for step in (1, 2):
            await call.send(notification("notifications/progress", {"progressToken": token, "progress": step}))
        return complete(content=TEXT)

    fake.handlers["tools/call"] = call_tool
    async with asyncio.timeout(WAIT):
        reply = await peer.request(
            "tools/call", {"name": "research", "arguments": {}, "task": {}, "_meta": {"progressToken": "p"}}
        )
        task_id = reply.result["task"]["taskId"]
        await until_status(peer, task_id, "completed")
        first = await peer.request("tasks/result", {"taskId": task_id})
        again = await peer.request("tasks/result", {"taskId": task_id})
    related = {RELATED: {"taskId": task_id}}
    assert first.interim == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "p", "progress": step, "_meta": related},
        }
        for step in (1, 2)
    ]
    assert first.result == {"content": TEXT, "_meta": related}
    assert again.interim == [] and again.result == first.result  # told once


async def test_input_the_call_needs_is_asked_on_the_tasks_result_stream_tagged_and_answered_upstream(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(
        input_required({"confirm": ELICIT}, request_state="round-1"), complete(content=TEXT)
    )
    async with asyncio.timeout(WAIT):
        task = await create(peer, "deploy")
        await until_status(peer, task["taskId"], "input_required")
        request_id, response = await peer.send("tasks/result", {"taskId": task["taskId"]})
        asked, final = await drive(peer, SseReader(response), request_id, ANSWERS)
        assert await status_of(peer, task["taskId"]) == "completed"
    [question] = asked
    assert question["method"] == "elicitation/create"
    assert question["params"]["_meta"][RELATED] == {"taskId": task["taskId"]}
    assert final["result"]["content"] == TEXT
    _, retry = fake.calls_of("tools/call")
    assert retry.params["requestState"] == "round-1"
    assert retry.params["inputResponses"] == {"confirm": ANSWERS["elicitation/create"]}


async def test_a_cancelled_task_ends_its_upstream_call_and_cannot_be_cancelled_again(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = gated(asyncio.Event(), complete(content=TEXT))  # never answers
    async with asyncio.timeout(WAIT):
        task = await create(peer)
        upstream = await fake.next_call("tools/call")
        cancelled = await peer.request("tasks/cancel", {"taskId": task["taskId"]})
        await upstream.cancelled.wait()  # the proxy closed the upstream request
        again = await peer.request("tasks/cancel", {"taskId": task["taskId"]})
        result = await peer.request("tasks/result", {"taskId": task["taskId"]})
        status = await status_of(peer, task["taskId"])
    assert (cancelled.result["status"], status) == ("cancelled", "cancelled")
    assert cancelled.result["statusMessage"] == "The task was cancelled by request."
    assert again.error["code"] == jsonrpc.INVALID_PARAMS
    assert again.error["message"] == "Cannot cancel task: already in terminal status 'cancelled'"
    assert result.error["code"] == jsonrpc.INVALID_PARAMS


async def test_a_failing_call_fails_its_task_and_tasks_result_is_the_calls_error(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(error(jsonrpc.INVALID_PARAMS, "Unknown tool: nope"))
    async with asyncio.timeout(WAIT):
        task = await create(peer, "nope")
        result = await peer.request("tasks/result", {"taskId": task["taskId"]})
        got = await peer.request("tasks/get", {"taskId": task["taskId"]})
    assert result.error == {"code": jsonrpc.INVALID_PARAMS, "message": "Unknown tool: nope"}
    assert (got.result["status"], got.result["statusMessage"]) == ("failed", "Unknown tool: nope")


async def test_a_task_outlives_its_session_and_is_the_callers_alone(make_proxy: MakeProxy, fake: FakeModern) -> None:
    fake.handlers["tools/call"] = scripted(complete(content=TEXT))
    proxy = await make_proxy()
    alice = {"Authorization": "Bearer alice-token"}
    async with asyncio.timeout(WAIT):
        first = await proxy.connect(headers=alice)
        task = await create(first)
        await until_status(first, task["taskId"], "completed")
        assert (await first.delete()).status == 200
        later = await proxy.connect(headers=alice)
        stranger = await proxy.connect(headers={"Authorization": "Bearer mallory-token"})
        mine = await later.request("tasks/result", {"taskId": task["taskId"]})
        theirs = [await stranger.request(m, {"taskId": task["taskId"]}) for m in ("tasks/get", "tasks/result")]
        cancel = await stranger.request("tasks/cancel", {"taskId": task["taskId"]})
        listed = await stranger.request("tasks/list")
    assert mine.result["content"] == TEXT
    for reply in [*theirs, cancel]:
        assert (reply.error["code"], reply.error["message"]) == (
            jsonrpc.INVALID_PARAMS,
            "Failed to retrieve task: Task not found",
        )
    assert listed.result == {"tasks": []}


async def test_a_task_is_kept_for_its_ttl_and_then_not_found(make_proxy: MakeProxy, fake: FakeModern) -> None:
    clock = FakeClock()
    fake.handlers["tools/call"] = scripted(complete(content=TEXT))
    proxy = await make_proxy(clock=clock)
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        task = await create(peer, task={"ttl": 2000})
        await until_status(peer, task["taskId"], "completed")
        clock.advance(1.9)
        kept = await peer.request("tasks/result", {"taskId": task["taskId"]})
        clock.advance(0.2)
        gone = [await peer.request(m, {"taskId": task["taskId"]}) for m in ("tasks/get", "tasks/result")]
        listed = await peer.request("tasks/list")
    assert kept.result["content"] == TEXT
    assert [reply.error["code"] for reply in gone] == [jsonrpc.INVALID_PARAMS] * 2
    assert listed.result == {"tasks": []}


async def test_tasks_list_pages_through_the_callers_tasks_oldest_first(make_proxy: MakeProxy, fake: FakeModern) -> None:
    clock = FakeClock()
    fake.handlers["tools/call"] = scripted(*[complete(content=TEXT)] * 3)
    proxy = await make_proxy(clock=clock, **{"tasks.page_size": 2})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        ids = []
        for _ in range(3):
            ids.append((await create(peer))["taskId"])
            clock.advance(0.001)
        first = await peer.request("tasks/list")
        second = await peer.request("tasks/list", {"cursor": first.result["nextCursor"]})
        bad = await peer.request("tasks/list", {"cursor": "not-a-cursor"})
    assert [t["taskId"] for t in first.result["tasks"]] == ids[:2]
    assert [t["taskId"] for t in second.result["tasks"]] == ids[2:]
    assert "nextCursor" not in second.result
    assert bad.error["code"] == jsonrpc.INVALID_PARAMS


async def test_tasks_past_the_callers_bound_are_refused(make_proxy: MakeProxy, fake: FakeModern) -> None:
    fake.handlers["tools/call"] = scripted(complete(content=TEXT))
    proxy = await make_proxy(**{"tasks.max_per_caller": 1})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        await create(peer)
        await fake.next_call("tools/call")
        refused = await peer.request("tools/call", {"name": "research", "arguments": {}, "task": {}})
    assert refused.error["code"] == jsonrpc.LIMIT_EXCEEDED
    assert "tasks.max_per_caller" in refused.error["message"]
    assert len(fake.calls_of("tools/call")) == 1


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tasks/get", {}),
        ("tasks/get", {"taskId": 5}),
        ("tasks/result", {"taskId": "nope"}),
        ("tasks/cancel", {"taskId": "nope"}),
    ],
)
async def test_a_request_naming_no_task_of_the_callers_is_invalid_params(
    peer: LegacyClient, fake: FakeModern, method: str, params: JSONDict
) -> None:
    async with asyncio.timeout(WAIT):
        reply = await peer.request(method, params)
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS
    assert fake.calls_of(method) == []


async def test_a_task_that_is_not_task_metadata_is_refused_before_any_call(
    peer: LegacyClient, fake: FakeModern
) -> None:
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/call", {"name": "research", "arguments": {}, "task": {"ttl": "soon"}})
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS
    assert fake.calls_of("tools/call") == []


async def test_with_tasks_off_nothing_is_advertised_and_task_methods_are_not_found(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    proxy = await make_proxy(**{"tasks.enabled": False})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("tasks/list")
    assert "tasks" not in peer.initialize_result["capabilities"]
    assert reply.error["code"] == jsonrpc.METHOD_NOT_FOUND
    assert fake.calls_of("tasks/list") == []  # 2026-07-28 has no such method


async def test_status_changes_are_told_on_the_sessions_get_stream(peer: LegacyClient, fake: FakeModern) -> None:
    gate = asyncio.Event()
    fake.handlers["tools/call"] = gated(gate, complete(content=TEXT))
    async with asyncio.timeout(WAIT):
        stream = await peer.get_stream()
        assert stream.status == 200
        task = await create(peer)
        gate.set()
        reader = SseReader(stream)
        while True:
            note = await reader.message()
            assert note is not None
            peer.check(note)
            if note.get("method") == "notifications/tasks/status":
                break
    assert (note["params"]["taskId"], note["params"]["status"]) == (task["taskId"], "completed")


async def test_a_task_whose_session_ends_while_it_waits_for_input_fails_saying_so(
    proxy: Proxy, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(input_required({"confirm": ELICIT}, request_state="round-1"))
    async with asyncio.timeout(WAIT):
        first = await proxy.connect()
        task = await create(first, "deploy")
        await until_status(first, task["taskId"], "input_required")
        _, response = await first.send("tasks/result", {"taskId": task["taskId"]})
        reader = SseReader(response)
        asked = await reader.message()  # the question, left unanswered
        assert (await first.delete()).status == 200
        later = await proxy.connect()
        result = await later.request("tasks/result", {"taskId": task["taskId"]})
        got = await later.request("tasks/get", {"taskId": task["taskId"]})
    assert asked is not None and asked["method"] == "elicitation/create"
    assert result.error["message"] == "the session the task asked for input ended before answering"
    assert got.result["status"] == "failed"


async def test_a_hosted_call_may_take_as_long_as_its_task_is_kept_not_one_requests_bound(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    async def slow(call: Call) -> Any:
        await asyncio.sleep(0.6)  # longer than upstream.request_timeout_s below
        return complete(content=TEXT)

    fake.handlers["tools/call"] = slow
    proxy = await make_proxy(**{"upstream.request_timeout_s": 0.2})
    peer = await proxy.connect("2025-11-25")
    async with asyncio.timeout(WAIT):
        task = await create(peer)
        result = await peer.request("tasks/result", {"taskId": task["taskId"]})
        plain = await peer.request("tools/call", {"name": "research", "arguments": {"q": "x"}})
    assert result.result["content"] == TEXT
    assert plain.error["code"] == jsonrpc.UPSTREAM_TIMEOUT  # the same call, not hosted, has the request's bound
