"""Legacy sessions on a real redis-server shared by replicas (store.url), in front of the fake
modern upstream: any replica serves any request; Redis down or slow never stalls a call, and
changes fail with a clear error; a Redis restarted empty does not end live sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from proxy.app import LEGACY_TASKS, LEGACY_TO_MODERN, METRICS, create_app
from proxy.config import load_settings
from proxy.relay.legacy_sessions import LegacySessionHost
from proxy.state.redis_store import RedisSessionStore
from proxy.state.redis_tracking import Tracking
from tests.integration.conftest import UPSTREAM_NAME, serve
from tests.support.fake_modern import FakeModern
from tests.support.legacy_client import LegacyClient, read_reply
from tests.support.mcp_client import SseReader
from tests.support.redis_server import RedisServer

SECRET = "replica-secret-0123456789"
JSONDict = dict[str, Any]
WAIT = 10.0  # upper bound for anything a test waits for


class Replicas:
    def __init__(self, aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern, redis: RedisServer) -> None:
        self._server, self._client, self._fake, self._redis = aiohttp_server, aiohttp_client, fake, redis
        self.apps: list[Any] = []

    async def start(self, **extra: Any) -> TestClient:
        settings = load_settings(
            None,
            **{
                "upstream.url": self._fake.url,
                "upstream.name": UPSTREAM_NAME,
                "upstream.era": "modern",
                "cache.watch": False,
                "security.secret": SECRET,
                "store.url": self._redis.url,
                **extra,
            },
        )
        app, _ = create_app(settings)
        self.apps.append(app)
        return await self._client(await serve(self._server, app))

    def host(self, index: int) -> LegacySessionHost[Any]:
        return self.apps[index][LEGACY_TO_MODERN]

    def metric(self, index: int, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.apps[index][METRICS].registry.get_sample_value(name, labels or {})


@pytest.fixture
def replicas(aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern, redis: RedisServer) -> Replicas:
    return Replicas(aiohttp_server, aiohttp_client, fake, redis)


async def test_any_replica_serves_the_session_and_sees_its_changes(replicas: Replicas, fake: FakeModern) -> None:
    a, b = await replicas.start(), await replicas.start()
    peer = await LegacyClient.connect(a, capabilities={"sampling": {}})
    peer.client = b
    assert (await peer.request("tools/list")).result is not None
    assert (await peer.request("logging/setLevel", {"level": "debug"})).result == {}
    peer.client = a
    await peer.request("tools/list")
    sent = fake.calls_of("tools/list")[-1]
    assert sent.meta.get("io.modelcontextprotocol/logLevel") == "debug"  # the level set on b
    # The client's capabilities travelled in the id: b declared them upstream without ever seeing
    # the initialize.
    assert "sampling" in (fake.calls_of("tools/list")[0].meta.get("io.modelcontextprotocol/clientCapabilities") or {})
    response = await peer.delete()
    assert response.status in (200, 204)
    peer.client = b
    _, after = await peer.send("tools/list")
    assert after.status == 404  # ended for every replica


async def test_redis_down_calls_go_on_changes_are_refused_readiness_holds(
    replicas: Replicas, redis: RedisServer
) -> None:
    a = await replicas.start(**{"store.timeout_ms": 100})
    peer = await LegacyClient.connect(a)
    await peer.request("logging/setLevel", {"level": "error"})
    redis.kill()
    async with asyncio.timeout(10):
        for _ in range(8):  # past the breaker's threshold
            assert (await peer.request("tools/list")).result is not None
        refused = await peer.request("logging/setLevel", {"level": "debug"})
    assert refused.error is not None
    assert refused.error["code"] == -32603
    assert "store is unavailable" in refused.error["message"]
    assert replicas.metric(0, "mcp_era_proxy_store_up") == 0
    new = await LegacyClient.connect(a)  # sessions still begin, recorded later
    assert (await new.request("tools/list")).result is not None
    ready = await a.get("/readyz")
    assert ready.status == 200, await ready.text()

    redis.start()  # empty
    for _ in range(100):  # the breaker lets one call through after breaker_open_s (2 s)
        if "result" in ((await peer.request("logging/setLevel", {"level": "debug"})).final or {}):
            break
        await asyncio.sleep(0.1)
    assert replicas.metric(0, "mcp_era_proxy_store_up") == 1
    assert (await new.request("tools/list")).result is not None
    b = await replicas.start()
    new.client = b
    assert (await new.request("tools/list")).result is not None  # recorded once Redis was back


async def test_a_redis_restart_with_an_empty_store_ends_no_session(replicas: Replicas, redis: RedisServer) -> None:
    a, b = await replicas.start(), await replicas.start()
    peers = [await LegacyClient.connect(a) for _ in range(5)]
    redis.kill()
    redis.start()
    for peer in peers:
        peer.client = b
        assert (await peer.request("tools/list")).result is not None
    assert replicas.metric(1, "mcp_era_proxy_sessions_resurrected_total") == 5
    # Brought back once: the next request finds the record again.
    assert (await peers[0].request("tools/list")).result is not None
    assert replicas.metric(1, "mcp_era_proxy_sessions_resurrected_total") == 5


async def test_ids_of_another_caller_or_altered_are_unknown_everywhere(replicas: Replicas) -> None:
    a, b = await replicas.start(), await replicas.start()
    peer = await LegacyClient.connect(a, headers={"Authorization": "Bearer alice"})
    peer.client = b
    _, foreign = await peer.send("tools/list", headers={"Authorization": "Bearer mallory"})
    assert foreign.status == 404
    good = peer.session_id
    for index in (0, len(good) // 2, len(good) - 1):
        peer.session_id = good[:index] + ("A" if good[index] != "A" else "B") + good[index + 1 :]
        _, tampered = await peer.send("tools/list")
        assert tampered.status == 404
    peer.session_id = good
    assert (await peer.request("tools/list")).result is not None


async def test_a_get_stream_moving_to_another_replica_is_told_to_refetch(replicas: Replicas, fake: FakeModern) -> None:
    a, b = await replicas.start(), await replicas.start()
    peer = await LegacyClient.connect(a)
    async with asyncio.timeout(10):
        assert (await peer.request("resources/subscribe", {"uri": "file:///watched"})).result == {}
        first = await peer.get_stream()
        await fake.wait_listen(lambda listen: bool(listen.filter.get("toolsListChanged")))
        first.close()  # the replica holding it died, or the connection was cut
        peer.client = b
        moved = await peer.get_stream()
        reader = SseReader(moved)
        hints = [await reader.message() for _ in range(4)]
        moved.close()
    methods = sorted(message["method"] for message in hints if message is not None)
    assert methods == [
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
        "notifications/resources/updated",
        "notifications/tools/list_changed",
    ]
    updated = next(m for m in hints if m is not None and m["method"] == "notifications/resources/updated")
    assert updated["params"] == {"uri": "file:///watched"}  # the subscription made through a


async def test_a_get_stream_reopened_on_the_same_replica_gets_no_hints(replicas: Replicas, fake: FakeModern) -> None:
    a = await replicas.start()
    peer = await LegacyClient.connect(a)
    async with asyncio.timeout(10):
        first = await peer.get_stream()
        await fake.wait_listen()
        first.close()
        again = await peer.get_stream()
        fake.listens[-1].push("notifications/tools/list_changed")
        message = await SseReader(again).message()
        again.close()
    assert message == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}  # the real one, alone


# ---------------------------------------------------------------------------- local copies, tracked


def _store(replicas: Replicas, index: int) -> RedisSessionStore:
    store = replicas.host(index)._store
    assert isinstance(store, RedisSessionStore)
    return store


async def _tracked(*stores: RedisSessionStore) -> None:
    async with asyncio.timeout(WAIT):
        while not all(store._tracking is not None and store._tracking.healthy() for store in stores):  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def _level_sent(fake: FakeModern) -> Any:
    return fake.calls_of("tools/list")[-1].meta.get("io.modelcontextprotocol/logLevel")


async def test_a_change_through_one_replica_is_seen_on_the_next_request_at_another(
    replicas: Replicas, fake: FakeModern
) -> None:
    a, b = await replicas.start(), await replicas.start()
    await _tracked(_store(replicas, 0), _store(replicas, 1))
    peer = await LegacyClient.connect(a)
    stale = 0
    for round_ in range(50):
        level = ("debug", "error", "warning")[round_ % 3]
        peer.client = a
        assert (await peer.request("logging/setLevel", {"level": level})).result == {}
        peer.client = b
        for _ in range(2):  # the first reads the record again, the second is served from the copy
            assert (await peer.request("tools/list")).result is not None
            stale += _level_sent(fake) != level
    assert stale == 0
    assert _store(replicas, 1).copies_served >= 40  # the copy was served, and never stale
    for _ in range(10):
        peer = await LegacyClient.connect(a)
        peer.client = b
        for _ in range(2):
            assert (await peer.request("tools/list")).result is not None
        peer.client = a
        assert (await peer.delete()).status in (200, 204)
        peer.client = b
        _, after = await peer.send("tools/list")
        assert after.status == 404  # ended for every replica at once


async def test_a_replica_whose_tracking_connection_is_cut_or_silent_reads_the_store(
    replicas: Replicas, fake: FakeModern, redis: RedisServer
) -> None:
    a, b = await replicas.start(), await replicas.start()
    here = _store(replicas, 1)
    await _tracked(_store(replicas, 0), here)
    peer = await LegacyClient.connect(a)
    peer.client = b
    for _ in range(2):
        await peer.request("tools/list")
    assert here.copies_served == 1
    admin = Redis.from_url(redis.url)
    try:
        # Cut by the server: no invalidation reaches b from now on.
        assert await admin.client_kill_filter(_type="pubsub") >= 2
    finally:
        await admin.aclose()
    peer.client = a
    await peer.request("logging/setLevel", {"level": "critical"})
    peer.client = b
    await peer.request("tools/list")
    assert _level_sent(fake) == "critical"
    await _tracked(here)  # connected again
    await peer.request("tools/list")
    await peer.request("tools/list")
    assert here.copies_served == 2

    # Silent: the connection stays open but nothing more is read from it. Past the heartbeat's
    # grace the copies are not trusted, before the connection is dropped and made again.
    tracking = here._tracking
    assert tracking is not None and tracking._wire is not None and tracking._wire.transport is not None
    tracking._wire.transport.pause_reading()
    async with asyncio.timeout(WAIT):
        while tracking.healthy():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    peer.client = a
    await peer.request("logging/setLevel", {"level": "alert"})
    peer.client = b
    await peer.request("tools/list")
    assert _level_sent(fake) == "alert"
    assert here.copies_served == 2
    await _tracked(here)  # dropped for its silence, and made again


async def test_the_tracking_connection_hears_every_change_and_distrusts_its_silence(redis: RedisServer) -> None:
    now = [100.0]
    heard: list[Any] = []
    resets: list[int] = []
    tracking = Tracking(
        redis.url, "t:{", on_keys=heard.append, on_reset=lambda: resets.append(1), timeout_s=0.05, clock=lambda: now[0]
    )
    writer = Redis.from_url(redis.url)
    try:
        async with asyncio.timeout(WAIT):
            while not tracking.healthy():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            assert resets == [1]  # nothing held before it was up is trusted
            await writer.set("t:{a}:s", b"1")
            await writer.pexpire("t:{a}:s", 60_000)  # a slid TTL is a change too
            await writer.set("other:{a}:s", b"1")  # outside the prefix
            await writer.flushdb()
            while len(heard) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert heard == [[b"t:{a}:s"], [b"t:{a}:s"], None]
        now[0] += 1.3  # past the heartbeat's grace (1 s + 0.25 s) without a word from Redis
        assert not tracking.healthy()
    finally:
        await tracking.aclose()
        await writer.aclose()
    assert not tracking.healthy()


# ---------------------------------------------------------------------------- tasks on Redis


async def _task_status(peer: LegacyClient, task_id: str) -> JSONDict:
    return (await peer.request("tasks/get", {"taskId": task_id})).result


async def test_a_task_made_on_one_replica_is_seen_listed_and_its_result_read_on_another(
    replicas: Replicas, fake: FakeModern, redis: RedisServer
) -> None:
    gate = asyncio.Event()

    async def slow(call: Any) -> Any:
        await gate.wait()
        return {"content": [{"type": "text", "text": "secret result"}]}

    fake.handlers["tools/call"] = slow
    a, b = await replicas.start(), await replicas.start()
    peer = await LegacyClient.connect(a)
    async with asyncio.timeout(WAIT):
        task = (await peer.request("tools/call", {"name": "t", "arguments": {}, "task": {"ttl": 60_000}})).result[
            "task"
        ]
        peer.client = b
        assert (await _task_status(peer, task["taskId"]))["status"] == "working"
        listed = (await peer.request("tasks/list")).result
        request_id, response = await peer.send("tasks/result", {"taskId": task["taskId"]})
        gate.set()  # b follows the record a writes, at the poll interval
        result = await read_reply(response, peer.version, "tasks/result", request_id)
    assert [t["taskId"] for t in listed["tasks"]] == [task["taskId"]]
    assert result.result["content"] == [{"type": "text", "text": "secret result"}]
    # Sealed at rest, kept as long as its retention.
    client = Redis.from_url(redis.url)
    try:
        keys = [key async for key in client.scan_iter(match="*:task:*")]
        assert len(keys) == 1
        assert b"secret result" not in await client.get(keys[0])
        assert 0 < await client.pttl(keys[0]) <= 60_000
    finally:
        await client.aclose()


async def test_a_task_cancelled_on_another_replica_stays_cancelled_when_its_call_ends(
    replicas: Replicas, fake: FakeModern
) -> None:
    gate = asyncio.Event()

    async def slow(call: Any) -> Any:
        await gate.wait()
        return {"content": []}

    fake.handlers["tools/call"] = slow
    a, b = await replicas.start(), await replicas.start()
    peer = await LegacyClient.connect(a)
    async with asyncio.timeout(WAIT):
        task = (await peer.request("tools/call", {"name": "t", "arguments": {}, "task": {}})).result["task"]
        await fake.next_call("tools/call")
        peer.client = b
        cancelled = (await peer.request("tasks/cancel", {"taskId": task["taskId"]})).result
        gate.set()
        await replicas.apps[0][LEGACY_TASKS].drain()  # a's call has ended and kept what it found
        peer.client = a
        after = await _task_status(peer, task["taskId"])
    assert cancelled["status"] == after["status"] == "cancelled"
    assert replicas.metric(0, "mcp_era_proxy_tasks_total", {"event": "completed"}) is None


async def test_a_task_past_its_retention_is_gone_from_redis_and_not_found(replicas: Replicas, fake: FakeModern) -> None:
    fake.handlers["tools/call"] = lambda call: asyncio.sleep(0, {"content": []})
    a = await replicas.start()
    peer = await LegacyClient.connect(a)
    async with asyncio.timeout(WAIT):
        task = (await peer.request("tools/call", {"name": "t", "arguments": {}, "task": {"ttl": 300}})).result["task"]
        while True:  # Redis expires the record by itself
            reply = await peer.request("tasks/get", {"taskId": task["taskId"]})
            if "error" in (reply.final or {}):
                break
            await asyncio.sleep(0.05)
        listed = (await peer.request("tasks/list")).result
    assert reply.error["code"] == -32602
    assert listed == {"tasks": []}


async def test_a_burst_of_new_sessions_larger_than_the_connection_pool_all_open(
    replicas: Replicas, redis: RedisServer
) -> None:
    """Clients reconnecting at once after a restart: more store calls at a time than the replica has
    connections to Redis wait their turn, within the call's deadline, and none fails (nor trips the
    breaker for everyone else)."""
    client = await replicas.start(
        **{
            "store.max_connections": 4,
            # The clients, the proxy and the upstream share this one event loop: a store call's wall
            # time here includes all of their work, which the default 50 ms deadline does not allow.
            "store.timeout_ms": 2000,
        }
    )
    async with asyncio.timeout(WAIT):
        peers = await asyncio.gather(*(LegacyClient.connect(client) for _ in range(60)))
    assert len({peer.session_id for peer in peers}) == 60
    assert replicas.metric(0, "mcp_era_proxy_store_up") == 1
    probe = Redis.from_url(redis.url)
    try:
        clients = await probe.info("clients")
    finally:
        await probe.aclose()
    assert clients["connected_clients"] <= 4 + 2  # the pool, the tracking connection, this one
