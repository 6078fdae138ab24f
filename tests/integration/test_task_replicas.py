"""Hosted tasks across replicas sharing a real redis-server (store.url), forwarding on: any replica
answers tasks/get from the record; what acts on the task's call (a 2026-07-28 client's tasks/update
and tasks/cancel, a 2025-11-25 client's tasks/result and tasks/cancel) reaching a replica other than
the one running it is replayed to that one (docs/use/tasks.md, "Tasks for 2025-11-25 clients", "Tasks for
2026-07-28 clients")."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.integration.test_forwarding import Replica, legacy_upstream, make_replica, modern_upstream
from tests.integration.test_legacy_to_modern_http import ANSWERS, ELICIT, drive, scripted
from tests.integration.test_modern_tasks_http import ASKING, created, ended, listened, until
from tests.integration.test_modern_to_legacy_http import (
    ACCEPTED,
    ELICIT_PARAMS,
    answered_after,
    tool_result,
)
from tests.integration.test_modern_to_legacy_tasks import RELATED, TASK, task_server
from tests.support.fake_legacy import Call, FakeLegacy, Outcome
from tests.support.fake_modern import FakeModern, complete, input_required
from tests.support.legacy_client import LegacyClient
from tests.support.mcp_client import SseReader
from tests.support.modern_client import ModernClient
from tests.support.redis_server import RedisServer

JSONDict = dict[str, Any]
__all__ = ["legacy_upstream", "make_replica", "modern_upstream"]  # pytest finds fixtures by module name
WAIT = 10.0  # upper bound for anything a test waits for


def alice(replica: Replica) -> ModernClient:
    return ModernClient(replica.http, capabilities=ASKING, headers={"Authorization": "Bearer alice"})


async def two(
    make_replica: Any, fake: FakeLegacy | FakeModern, redis: RedisServer, era: str = "legacy"
) -> tuple[Replica, Replica]:
    first = await make_replica(fake.url, era, **{"store.url": redis.url})
    second = await make_replica(fake.url, era, **{"store.url": redis.url})
    return first, second


async def test_input_answered_on_another_replica_reaches_the_task_and_it_completes(
    make_replica: Any, legacy_upstream: FakeLegacy, redis: RedisServer
) -> None:
    async def result(call: Call) -> Outcome:
        answer = await call.ask("elicitation/create", {**ELICIT_PARAMS, "_meta": dict(RELATED)})
        return tool_result(f"researched: {answer['result']['action']}")

    task_server(legacy_upstream, result)
    first, second = await two(make_replica, legacy_upstream, redis)
    async with asyncio.timeout(WAIT):
        handle = await created(alice(first), {"name": "research", "arguments": {}})
        asking = await until(alice(second), handle["taskId"], lambda t: t["status"] == "input_required")
        [key] = asking["inputRequests"]
        update = {"taskId": handle["taskId"], "inputResponses": {key: ACCEPTED}}
        acked = await alice(second).request("tasks/update", update)
        done = await until(alice(second), handle["taskId"], ended)
    assert acked.result == {"resultType": "complete"}
    assert done["status"] == "completed"
    assert done["result"]["content"] == tool_result("researched: accept")["content"]
    assert second.forwards("task", "ok") == 1.0


async def test_a_task_cancelled_on_another_replica_is_cancelled_where_its_call_runs(
    make_replica: Any, legacy_upstream: FakeLegacy, redis: RedisServer
) -> None:
    task_server(legacy_upstream, answered_after(asyncio.Event(), None))  # never ends by itself
    legacy_upstream.handlers["tasks/cancel"] = lambda call: asyncio.sleep(0, {**TASK, "status": "cancelled"})
    first, second = await two(make_replica, legacy_upstream, redis)
    async with asyncio.timeout(WAIT):
        handle = await created(alice(first), {"name": "research", "arguments": {}})
        await legacy_upstream.next_call("tasks/result")
        acked = await alice(second).request("tasks/cancel", {"taskId": handle["taskId"]})
        upstream = await legacy_upstream.next_call("tasks/cancel")  # the call on the first replica ended
        task = await until(alice(second), handle["taskId"], ended)
    assert acked.result == {"resultType": "complete"}
    assert upstream.params == {"taskId": TASK["taskId"]}
    assert task["status"] == "cancelled"
    assert second.forwards("task", "ok") == 1.0


# ---------------------------------------------------------------------------- 2025-11-25 clients


async def legacy_task(peer: LegacyClient) -> JSONDict:
    reply = await peer.request("tools/call", {"name": "deploy", "arguments": {}, "task": {"ttl": 60_000}})
    assert reply.status == 200, reply.messages
    return reply.result["task"]


async def test_a_legacy_tasks_result_on_another_replica_gets_the_tasks_input_requests(
    make_replica: Any, modern_upstream: FakeModern, redis: RedisServer
) -> None:
    modern_upstream.handlers["tools/call"] = scripted(
        input_required({"confirm": ELICIT}, request_state="round-1"), complete(content=[{"type": "text", "text": "ok"}])
    )
    first, second = await two(make_replica, modern_upstream, redis, era="modern")
    peer = await LegacyClient.connect(first.http)
    async with asyncio.timeout(WAIT):
        task = await legacy_task(peer)
        peer.client = second.http
        request_id, response = await peer.send("tasks/result", {"taskId": task["taskId"]})
        asked, final = await drive(peer, SseReader(response), request_id, ANSWERS)
    [question] = asked
    assert question["method"] == "elicitation/create"
    assert final["result"]["content"] == [{"type": "text", "text": "ok"}]
    _, retry = modern_upstream.calls_of("tools/call")
    assert retry.params["inputResponses"] == {"confirm": ANSWERS["elicitation/create"]}
    assert second.forwards("task", "ok") == 1.0


async def test_a_legacy_tasks_cancel_on_another_replica_ends_the_call_where_it_runs(
    make_replica: Any, modern_upstream: FakeModern, redis: RedisServer
) -> None:
    never = asyncio.Event()

    async def held(call: Any) -> Any:
        await never.wait()
        return complete(content=[])

    modern_upstream.handlers["tools/call"] = held
    first, second = await two(make_replica, modern_upstream, redis, era="modern")
    peer = await LegacyClient.connect(first.http)
    async with asyncio.timeout(WAIT):
        task = await legacy_task(peer)
        upstream = await modern_upstream.next_call("tools/call")
        peer.client = second.http
        cancelled = await peer.request("tasks/cancel", {"taskId": task["taskId"]})
        await upstream.cancelled.wait()  # the first replica closed the upstream request
    assert cancelled.result["status"] == "cancelled"
    assert second.forwards("task", "ok") == 1.0


async def test_a_listen_on_another_replica_gets_the_tasks_changes_from_the_store(
    make_replica: Any, legacy_upstream: FakeLegacy, redis: RedisServer
) -> None:
    release = asyncio.Event()
    task_server(legacy_upstream, answered_after(release, tool_result("done elsewhere")))
    first, second = await two(make_replica, legacy_upstream, redis)
    async with asyncio.timeout(WAIT):
        handle = await created(alice(first), {"name": "research", "arguments": {}})
        ack, note = await listened(alice(second), [handle["taskId"]], release)
    assert ack is not None and ack["params"]["notifications"]["taskIds"] == [handle["taskId"]]
    assert note is not None and note["method"] == "notifications/tasks"
    assert note["params"]["status"] == "completed"
    assert note["params"]["result"]["content"] == tool_result("done elsewhere")["content"]
