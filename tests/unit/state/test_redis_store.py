"""The Redis session store against fakeredis (a real redis-server is in tests/integration).

What it keeps and where, what it never writes into keys, and what each store failure does: the
breaker, serving from the last state seen, refusing changes, bringing back sessions Redis lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from proxy.config import StoreConfig
from proxy.metrics import Metrics
from proxy.state.redis_connection import Breaker, key_hash
from proxy.state.redis_store import RedisSessionStore
from proxy.state.sealing import Sealer
from proxy.state.sessions import LegacySession, SessionCore, SessionIds, StoreUnavailable, principal_of

SECRET = b"0123456789abcdef0123456789abcdef"
ALICE = principal_of("Bearer alice")
IDLE = 600.0
LIFETIME = 86_400.0


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Broken:
    """A client whose every call fails, like a Redis that is down."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    def pipeline(self, transaction: bool = False) -> Broken:
        return self

    def register_script(self, script: str) -> Any:
        async def run(keys: Any = None, args: Any = None) -> Any:
            return await self.execute()

        return run

    def __getattr__(self, name: str) -> Any:
        def command(*args: Any, **kwargs: Any) -> Any:
            return None

        return command

    async def execute(self) -> Any:
        self.calls += 1
        raise self.exc


class Slow(Broken):
    async def execute(self) -> Any:
        self.calls += 1
        await asyncio.sleep(10)
        raise AssertionError("never reached: the deadline cuts it")


def _store(client: Any, clock: Clock, metrics: Metrics | None = None, **config: Any) -> RedisSessionStore:
    return RedisSessionStore(
        client,
        StoreConfig(**config),
        Sealer(SECRET, clock=clock),
        idle_timeout_s=IDLE,
        max_lifetime_s=LIFETIME,
        metrics=metrics or Metrics(),
        clock=clock,
    )


def _described(ids: SessionIds, session_id: str, clock: Clock) -> LegacySession:
    opened = ids.open(session_id, ALICE)
    assert opened is not None
    return LegacySession.from_id(session_id, ALICE, opened, clock(), None)


def _new(ids: SessionIds, clock: Clock, core: SessionCore | None = None) -> LegacySession:
    core = core or SessionCore("2025-06-18", "2026-07-28", {"sampling": {}}, {}, {"tools": {}}, {"name": "host"})
    return _described(ids, ids.mint(ALICE, core), clock)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[None]:
    """fakeredis reads files on the event loop (its command table, Lua support), which the suite's
    guard would fail; the store itself runs under the guard against a real redis-server in
    tests/integration/test_store_redis_server.py."""
    yield


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ids(clock: Clock) -> SessionIds:
    return SessionIds(Sealer(SECRET, clock=clock), LIFETIME, clock)


async def test_another_replica_sees_the_changing_state(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock), _store(redis, clock)
    session = _new(ids, clock)
    await here.add(session)
    session.log_level = "debug"
    session.initialized = True
    session.subscriptions = frozenset({"file:///a", "file:///b"})
    session.modern_version = "2026-09-01"
    await here.save(session)
    seen = await there.load(_described(ids, session.id, clock))
    assert seen is not None
    assert (seen.log_level, seen.initialized, seen.subscriptions, seen.modern_version) == (
        "debug",
        True,
        frozenset({"file:///a", "file:///b"}),
        "2026-09-01",
    )
    assert seen.client_capabilities == {"sampling": {}}  # from the id


async def test_keys_and_values_hold_neither_ids_principals_nor_uris(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    store = _store(redis, clock, namespace="t1")
    session = _new(ids, clock)
    session.subscriptions = frozenset({"file:///secret-plan.txt"})
    await store.add(session)
    await store.remove(_new(ids, clock).id)
    dumped = b""
    for key in await redis.keys("*"):
        dumped += key
        kind = await redis.type(key)
        if kind == b"hash":
            for field, value in (await redis.hgetall(key)).items():
                dumped += field + value
        else:
            dumped += await redis.get(key) or b""
        assert key.startswith(b"t1:")
    assert session.id.encode() not in dumped
    assert ALICE.encode() not in dumped
    assert b"secret-plan" not in dumped


async def test_the_record_slides_with_use_and_expires_when_idle(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    store = _store(redis, clock)
    session = _new(ids, clock)
    await store.add(session)
    key = store._record(session.id)
    await redis.pexpire(key, 1000)  # as if idle for nearly the whole timeout
    assert store.held(session.id) is None  # a shared record is always read (and slid)
    assert await store.load(_described(ids, session.id, clock)) is not None
    assert await redis.pttl(key) > 1000 * 100  # slid back to the idle timeout
    await redis.delete(key)  # the TTL ran out (the epoch is older than the session)
    assert await store.load(_described(ids, session.id, clock)) is None


async def test_a_deleted_session_stays_deleted(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    store = _store(redis, clock)
    session = _new(ids, clock)
    await store.add(session)
    assert await store.remove(session.id) is True
    assert await store.load(_described(ids, session.id, clock)) is None
    await redis.delete(store._prefix + "epoch")  # even after the store lost everything else
    assert await store.load(_described(ids, session.id, clock)) is None
    assert await store.remove(session.id) is False


async def test_a_store_that_restarted_empty_brings_live_sessions_back(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    metrics = Metrics()
    store = _store(redis, clock, metrics)
    session = _new(ids, clock)
    session.log_level = "error"
    await store.add(session)
    await store.save(session)
    clock.now += 5
    await redis.flushall()
    back = await store.load(_described(ids, session.id, clock))
    assert back is not None
    assert back.log_level is None  # the default: the lost level is not invented
    assert metrics.sessions_resurrected._value.get() == 1
    assert await redis.exists(store._record(session.id))  # recorded again
    assert await store.load(_described(ids, session.id, clock)) is not None
    assert metrics.sessions_resurrected._value.get() == 1


async def test_a_session_begun_after_the_restart_that_idles_out_is_gone(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    store = _store(redis, clock)
    await redis.flushall()
    clock.now += 1
    session = _new(ids, clock)
    await store.add(session)  # writes the epoch, older than the session
    await redis.delete(store._record(session.id))
    assert await store.load(_described(ids, session.id, clock)) is None


async def test_down_store_calls_keep_working_and_changes_are_refused(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    metrics = Metrics()
    store = _store(redis, clock, metrics)
    session = _new(ids, clock)
    session.log_level = "warning"
    await store.add(session)
    await store.save(session)
    broken = Broken(ConnectionError("refused"))  # Redis goes down
    store.client = broken  # type: ignore[assignment]
    store._load = store._save = broken.register_script("")
    served = await store.load(_described(ids, session.id, clock))
    assert served is not None and served.log_level == "warning"  # as last seen here
    unknown = await store.load(_new(ids, clock))
    assert unknown is not None and unknown.log_level is None  # as its id describes it
    with pytest.raises(StoreUnavailable) as refused:
        await store.save(served)
    assert refused.value.code == -32603
    assert "store is unavailable" in refused.value.message
    assert refused.value.data == {"reason": "store_unavailable"}
    assert metrics.store_errors.labels("save", "error")._value.get() == 1


async def test_a_slow_store_is_cut_at_its_deadline(clock: Clock, ids: SessionIds) -> None:
    store = _store(Slow(RuntimeError()), clock, timeout_ms=20)
    session = _new(ids, clock)
    async with asyncio.timeout(2):
        assert await store.load(session) is session
        with pytest.raises(StoreUnavailable):
            await store.save(session)


async def test_the_breaker_fails_fast_then_tries_again(clock: Clock, ids: SessionIds) -> None:
    metrics = Metrics()
    broken = Broken(OSError("down"))
    store = _store(broken, clock, metrics, breaker_failures=3, breaker_open_s=2.0)
    session = _new(ids, clock)
    for _ in range(5):
        with pytest.raises(StoreUnavailable):
            await store.save(session)
    assert broken.calls == 3  # the last two were refused without a call
    assert metrics.store_up._value.get() == 0
    assert metrics.store_errors.labels("save", "rejected")._value.get() == 2
    assert not store.up


def test_breaker_states() -> None:
    now = [0.0]
    breaker = Breaker(2, 1.0, clock=lambda: now[0])
    assert breaker.allow()
    breaker.failed()
    assert breaker.allow() and breaker.closed
    breaker.failed()
    assert not breaker.closed and not breaker.allow()
    now[0] = 1.5
    assert breaker.allow()  # half-open: one probe
    assert not breaker.allow()  # and only one
    breaker.failed()
    assert not breaker.allow()
    now[0] = 3.0
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.closed and breaker.allow()


async def test_a_core_too_large_for_the_id_lives_in_the_store(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    store = _store(redis, clock)
    core = SessionCore("2025-06-18", "2026-07-28", {}, {}, {}, {"name": "host", "icon": "x" * 5000})
    session = _new(ids, clock, core)
    assert session.core_in_store and session.client_info is None
    session.client_info = core.client_info  # as the host builds it at initialize
    session.legacy_version = core.legacy_version
    await store.add(session)
    seen = await _store(redis, clock).load(_described(ids, session.id, clock))
    assert seen is not None and seen.client_info == core.client_info and seen.legacy_version == "2025-06-18"
    await redis.flushall()  # lost with the store: such a session cannot come back
    assert await store.load(_described(ids, session.id, clock)) is None


async def test_count_is_the_sessions_served_here_lately(clock: Clock, ids: SessionIds) -> None:
    store = _store(fakeredis.FakeAsyncRedis(), clock)
    for _ in range(3):
        await store.add(_new(ids, clock))
    assert store.count() == 3
    clock.now += IDLE + 1
    assert store.count() == 0


async def test_a_read_cache_serves_recent_state_without_a_round_trip(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock, read_cache_ms=500), _store(redis, clock)
    session = _new(ids, clock)
    session.initialized = True
    await here.add(session)
    assert await here.load(_described(ids, session.id, clock)) is not None
    changed = await there.load(_described(ids, session.id, clock))
    assert changed is not None
    changed.log_level = "debug"
    await there.save(changed)
    cached = await here.load(_described(ids, session.id, clock))
    assert cached is not None and cached.log_level is None  # within the window: as read here
    clock.now += 0.5
    fresh = await here.load(_described(ids, session.id, clock))
    assert fresh is not None and fresh.log_level == "debug"  # past it: read again


async def test_a_read_cache_never_serves_a_session_not_yet_initialized(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock, read_cache_ms=5000), _store(redis, clock)
    session = _new(ids, clock)
    await here.add(session)
    elsewhere = await there.load(_described(ids, session.id, clock))
    assert elsewhere is not None
    elsewhere.initialized = True  # notifications/initialized reached another replica
    await there.save(elsewhere)
    seen = await here.load(_described(ids, session.id, clock))
    assert seen is not None and seen.initialized


async def test_a_change_racing_a_delete_does_not_bring_the_session_back(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock), _store(redis, clock)
    session = _new(ids, clock)
    await here.add(session)
    loaded = await there.load(_described(ids, session.id, clock))  # e.g. a GET stream opening
    assert loaded is not None
    assert await here.remove(session.id)  # DELETE on another replica meanwhile
    loaded.stream_owner = "boot@10.0.0.2:8081"
    await there.save(loaded)  # the GET's change lands after the DELETE
    assert await redis.exists(there._record(session.id)) == 0
    assert await there.load(_described(ids, session.id, clock)) is None


async def test_replicas_changing_different_fields_at_once_lose_neither(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    a, b = _store(redis, clock), _store(redis, clock)
    session = _new(ids, clock)
    await a.add(session)
    on_a = await a.load(_described(ids, session.id, clock))
    on_b = await b.load(_described(ids, session.id, clock))  # both read before either writes
    assert on_a is not None and on_b is not None
    on_a.log_level = "warning"
    await a.save(on_a, ("log_level",))  # logging/setLevel through a
    on_b.stream_owner = "boot@10.0.0.2:8081"
    await b.save(on_b, ("stream_owner",))  # the GET stream opening on b, with b's older copy
    seen = await _store(redis, clock).load(_described(ids, session.id, clock))
    assert seen is not None
    assert (seen.log_level, seen.stream_owner) == ("warning", "boot@10.0.0.2:8081")


async def test_a_session_s_keys_are_named_by_its_hash_as_kept(clock: Clock, ids: SessionIds) -> None:
    store = _store(fakeredis.FakeAsyncRedis(), clock)
    session = _new(ids, clock)
    assert store._record(session.id) == f"{store._prefix}{{{key_hash(session.id)}}}:s"
    assert store._record(session.id) == store._record(session.id)  # from what was kept the second time
    assert store._tombstone(session.id).endswith(f"{{{key_hash(session.id)}}}:x")
