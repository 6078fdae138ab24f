"""Legacy clients of a 2026-07-28 upstream that runs calls as tasks of the `io.modelcontextprotocol/tasks`
extension: the proxy declares the extension and follows the task for the client, through the real
app to a scripted modern server (io.modelcontextprotocol/tasks extension
(specification/draft/tasks.md); docs/use/tasks.md). Every tasks/* request the
fake receives is checked against the extension's vendored schema (tests/support/fake_modern.py).
A session learns the upstream's capabilities when it opens: each test connects once the fake
declares the extension."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol import task_extension as te
from tests.integration.conftest import MakeProxy, Proxy
from tests.integration.test_legacy_tasks_http import create, status_of, until_status
from tests.integration.test_legacy_to_modern_http import ANSWERS, ELICIT, drive, scripted
from tests.support.fake_modern import Call, FakeModern, Outcome, complete, error
from tests.support.legacy_client import LegacyClient
from tests.support.mcp_client import SseReader
from tests.unit.protocol import test_task_follow as follow
from tests.unit.protocol.test_task_follow import TASK_ID

JSONDict = dict[str, Any]
WAIT = 5.0
TEXT = [{"type": "text", "text": "done upstream"}]
ACK = {"resultType": "complete"}
FAST = {"pollIntervalMs": 10}  # below the proxy's floor: polled every te.MIN_POLL_MS


def task(status: str = "working", **fields: Any) -> JSONDict:
    return follow.task(status, **{**FAST, **fields})


def got(status: str = "working", **fields: Any) -> JSONDict:
    return follow.got(status, **{**FAST, **fields})


def declared(call: Call) -> bool:
    return te.declared(call.meta.get(meta.CLIENT_CAPABILITIES))


async def as_task(call: Call) -> Outcome:
    """tools/call: a task when the request declared the extension, else the plain result."""
    if declared(call):
        return {"resultType": "task", **task()}
    return complete(content=[{"type": "text", "text": "plain"}])


class Upstream:
    """The fake's tasks/* handlers: tasks/get answers `states` in turn (the last one repeats)."""

    def __init__(self, fake: FakeModern, *states: Outcome) -> None:
        self.states = list(states)
        self.cancelled = asyncio.Event()
        fake.discover["capabilities"]["extensions"] = {te.EXTENSION: {}}
        fake.handlers["tools/call"] = as_task
        fake.handlers["tasks/get"] = self.get
        fake.handlers["tasks/update"] = self.update
        fake.handlers["tasks/cancel"] = self.cancel

    async def get(self, call: Call) -> Outcome:
        assert call.headers.get("Mcp-Name") == call.params["taskId"] == TASK_ID
        assert declared(call)
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    async def update(self, call: Call) -> Outcome:
        assert call.headers.get("Mcp-Name") == TASK_ID
        return ACK

    async def cancel(self, call: Call) -> Outcome:
        assert call.headers.get("Mcp-Name") == TASK_ID and declared(call)
        self.cancelled.set()
        return ACK


async def call_tool(peer: LegacyClient, name: str = "research") -> Any:
    return await peer.request("tools/call", {"name": name, "arguments": {"q": "x"}})


async def test_a_plain_call_declares_the_extension_and_gets_the_tasks_result(proxy: Proxy, fake: FakeModern) -> None:
    Upstream(fake, got(), got(), got("completed", result={"content": TEXT, "isError": False}))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.result == {"content": TEXT, "isError": False}
    [upstream] = fake.calls_of("tools/call")
    assert upstream.meta[meta.CLIENT_CAPABILITIES]["extensions"] == {te.EXTENSION: {}}
    assert len(fake.calls_of("tasks/get")) == 3
    assert fake.calls_of("tasks/cancel") == []  # it ended: nothing to cancel


async def test_an_upstream_without_the_extension_is_never_offered_it(proxy: Proxy, fake: FakeModern) -> None:
    fake.handlers["tools/call"] = as_task
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.result["content"] == [{"type": "text", "text": "plain"}]
    [upstream] = fake.calls_of("tools/call")
    assert "extensions" not in upstream.meta[meta.CLIENT_CAPABILITIES]


async def test_with_follow_upstream_off_the_extension_is_not_declared(make_proxy: MakeProxy, fake: FakeModern) -> None:
    Upstream(fake, got("completed", result={"content": TEXT}))
    proxy = await make_proxy(**{"tasks.follow_upstream": False})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.result["content"] == [{"type": "text", "text": "plain"}]
    assert fake.calls_of("tasks/get") == []


async def test_a_failed_task_is_the_calls_json_rpc_error(proxy: Proxy, fake: FakeModern) -> None:
    failure = {"code": -32603, "message": "API rate limit exceeded", "data": {"retryAfterS": 30}}
    Upstream(fake, got("failed", error=failure, statusMessage="Tool execution failed"))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.error == failure


async def test_a_task_the_upstream_cancelled_is_an_error_for_the_client(proxy: Proxy, fake: FakeModern) -> None:
    Upstream(fake, got("cancelled"))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR
    assert reply.error["message"] == "the upstream cancelled the task running this call"


async def test_a_task_that_expired_upstream_fails_the_call_saying_so(proxy: Proxy, fake: FakeModern) -> None:
    Upstream(fake, got(), error(jsonrpc.INVALID_PARAMS, "Failed to retrieve task: Task has expired", status=400))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR
    assert reply.error["message"].startswith("the upstream no longer knows the task running this call")
    assert reply.error["data"]["upstreamError"]["code"] == jsonrpc.INVALID_PARAMS
    assert fake.calls_of("tasks/cancel") == []


async def test_input_the_task_needs_is_asked_once_and_answered_with_tasks_update(
    proxy: Proxy, fake: FakeModern
) -> None:
    asking = got("input_required", inputRequests={"confirm": ELICIT})
    # Asked, then the same snapshot twice more (the answer not reflected yet), then done.
    Upstream(fake, asking, asking, asking, got("completed", result={"content": TEXT}))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        request_id, response = await peer.send("tools/call", {"name": "deploy", "arguments": {}})
        asked, final = await drive(peer, SseReader(response), request_id, ANSWERS)
    [question] = asked
    assert question["method"] == "elicitation/create"
    assert question["params"]["message"] == ELICIT["params"]["message"]
    assert final["result"]["content"] == TEXT
    [update] = fake.calls_of("tasks/update")
    assert update.params["taskId"] == TASK_ID
    assert update.params["inputResponses"] == {"confirm": ANSWERS["elicitation/create"]}
    assert len(fake.calls_of("tools/call")) == 1  # answered with tasks/update, not a retry of the call


async def test_a_plain_call_the_client_cancels_cancels_the_upstream_task(proxy: Proxy, fake: FakeModern) -> None:
    upstream = Upstream(fake, got())  # works forever
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        request_id, response = await peer.send("tools/call", {"name": "research", "arguments": {}})
        await fake.next_call("tasks/get")  # it follows the task
        assert await peer.notify("notifications/cancelled", {"requestId": request_id, "reason": "user"}) == 202
        await upstream.cancelled.wait()
        response.close()
    [cancel] = fake.calls_of("tasks/cancel")
    assert cancel.params["taskId"] == TASK_ID


async def test_a_hosted_task_follows_the_upstream_task_to_its_result(proxy: Proxy, fake: FakeModern) -> None:
    Upstream(fake, got(), got("completed", result={"content": TEXT}))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        hosted = await create(peer)
        result = await peer.request("tasks/result", {"taskId": hosted["taskId"]})
        status = await status_of(peer, hosted["taskId"])
    assert hosted["taskId"] != TASK_ID  # the proxy's own task, never the upstream's id
    assert result.result["content"] == TEXT and status == "completed"
    [upstream] = fake.calls_of("tools/call")
    assert "task" not in upstream.params and declared(upstream)


async def test_a_hosted_task_is_input_required_while_the_upstream_task_asks(proxy: Proxy, fake: FakeModern) -> None:
    Upstream(
        fake,
        got(),
        got("input_required", inputRequests={"confirm": ELICIT}),
        got("completed", result={"content": TEXT}),
    )
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        hosted = await create(peer, "deploy")
        await until_status(peer, hosted["taskId"], "input_required")
        request_id, response = await peer.send("tasks/result", {"taskId": hosted["taskId"]})
        asked, final = await drive(peer, SseReader(response), request_id, ANSWERS)
        assert await status_of(peer, hosted["taskId"]) == "completed"
    [question] = asked
    assert question["params"]["_meta"][meta.RELATED_TASK] == {"taskId": hosted["taskId"]}
    assert final["result"]["content"] == TEXT
    [update] = fake.calls_of("tasks/update")
    assert update.params["inputResponses"] == {"confirm": ANSWERS["elicitation/create"]}


async def test_cancelling_a_hosted_task_cancels_the_upstream_task(proxy: Proxy, fake: FakeModern) -> None:
    upstream = Upstream(fake, got())
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        hosted = await create(peer)
        await fake.next_call("tasks/get")
        cancelled = await peer.request("tasks/cancel", {"taskId": hosted["taskId"]})
        await upstream.cancelled.wait()
    assert cancelled.result["status"] == "cancelled"
    [cancel] = fake.calls_of("tasks/cancel")
    assert cancel.params["taskId"] == TASK_ID


async def test_an_unanswered_round_cancels_the_upstream_task(make_proxy: MakeProxy, fake: FakeModern) -> None:
    upstream = Upstream(fake, got("input_required", inputRequests={"confirm": ELICIT}))
    proxy = await make_proxy(**{"input.round_timeout_s": 0.2})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        _, response = await peer.send("tools/call", {"name": "deploy", "arguments": {}})
        reader = SseReader(response)
        messages = []
        while (message := await reader.message()) is not None:
            messages.append(message)
        await upstream.cancelled.wait()
    assert messages[0]["method"] == "elicitation/create"
    assert messages[-1]["error"]["message"] == "the client did not answer the input requests in time"


@pytest.mark.parametrize(
    "created",
    [
        {"resultType": "task", "status": "working"},  # no taskId
        {"resultType": "task", **task(), "ttlMs": "soon"},
    ],
)
async def test_an_invalid_task_answer_fails_the_call(proxy: Proxy, fake: FakeModern, created: JSONDict) -> None:
    Upstream(fake, got())
    fake.handlers["tools/call"] = scripted(created)
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await call_tool(peer)
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR
    assert "invalid CreateTaskResult" in reply.error["message"]
    assert fake.calls_of("tasks/get") == []


async def test_the_proxy_shutting_down_cancels_the_upstream_tasks_it_follows(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    upstream = Upstream(fake, got())
    proxy: Proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        hosted = await create(peer)
        await fake.next_call("tasks/get")
        await proxy.client.close()  # the app's cleanup runs: hosted tasks end, their upstream tasks too
        await upstream.cancelled.wait()
    assert hosted["status"] == "working"
