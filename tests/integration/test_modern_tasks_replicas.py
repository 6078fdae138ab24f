"""Tasks of 2026-07-28 clients across replicas sharing a real redis-server (store.url): any replica
answers tasks/get from the record; a tasks/update or tasks/cancel reaching a replica other than
the one running the task's call is replayed to that one (README "Tasks for 2026-07-28 clients")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_forwarding import Replica, legacy_upstream, make_replica
from tests.integration.test_modern_tasks_http import ASKING, created, ended, until
from tests.integration.test_modern_to_legacy_http import ACCEPTED, ELICIT_PARAMS, tool_result
from tests.integration.test_modern_to_legacy_tasks import RELATED, TASK, task_server
from tests.support.fake_legacy import Call, FakeLegacy, Outcome
from tests.support.modern_peer import ModernPeer
from tests.support.redis_server import RedisServer

__all__ = ["legacy_upstream", "make_replica"]  # pytest finds fixtures by module name
WAIT = 10.0  # upper bound for anything a test waits for


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def alice(replica: Replica) -> ModernPeer:
    return ModernPeer(replica.http, capabilities=ASKING, headers={"Authorization": "Bearer alice"})


async def two(make_replica: Any, fake: FakeLegacy, redis: RedisServer) -> tuple[Replica, Replica]:
    first = await make_replica(fake.url, "legacy", **{"store.url": redis.url})
    second = await make_replica(fake.url, "legacy", **{"store.url": redis.url})
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
    async def result(call: Call) -> Outcome:
        await asyncio.Event().wait()  # never ends by itself
        return None

    task_server(legacy_upstream, result)
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
