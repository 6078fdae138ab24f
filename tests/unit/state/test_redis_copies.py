"""Local copies of session records (redis_store.py), kept fresh by what Redis says changed
(redis_tracking.py): served without a round trip only while the tracking says every change
reached here, dropped by an invalidation, never kept from a read a change overtook. The tracking
connection itself runs against a real redis-server in tests/integration/test_store_redis_server.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from proxy.config import StoreConfig
from proxy.metrics import Metrics
from proxy.state.redis_store import RedisSessionStore
from proxy.state.redis_tracking import RespError, command, parse
from proxy.state.sealing import Sealer
from proxy.state.sessions import LegacySession, SessionCore, SessionIds, principal_of

SECRET = b"0123456789abcdef0123456789abcdef"
ALICE = principal_of("Bearer alice")
IDLE = 600.0


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTracking:
    """What the store asks of the tracking connection."""

    def __init__(self) -> None:
        self.up = True
        self.epoch = 1

    def healthy(self) -> bool:
        return self.up

    async def aclose(self) -> None:
        return None


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[None]:
    yield  # fakeredis reads files on the event loop (see test_redis_store.py)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ids(clock: Clock) -> SessionIds:
    return SessionIds(Sealer(SECRET, clock=clock), 86_400.0, clock)


def _store(client: Any, clock: Clock, tracking: FakeTracking | None = None, **config: Any) -> RedisSessionStore:
    store = RedisSessionStore(
        client,
        StoreConfig(**config),
        Sealer(SECRET, clock=clock),
        idle_timeout_s=IDLE,
        max_lifetime_s=86_400.0,
        metrics=Metrics(),
        clock=clock,
    )
    if tracking is not None:
        store.track(tracking)  # type: ignore[arg-type]
    return store


def _described(ids: SessionIds, session_id: str, clock: Clock) -> LegacySession:
    opened = ids.open(session_id, ALICE)
    assert opened is not None
    return LegacySession.from_id(session_id, ALICE, opened, clock(), None)


async def _begun(store: RedisSessionStore, ids: SessionIds, clock: Clock) -> LegacySession:
    session = _described(ids, ids.mint(ALICE, SessionCore("2025-06-18", "2026-07-28")), clock)
    await store.add(session)
    return session


async def _level(store: RedisSessionStore, ids: SessionIds, session: LegacySession, clock: Clock) -> str | None:
    loaded = await store.load(_described(ids, session.id, clock))
    assert loaded is not None
    return loaded.log_level


async def test_a_tracked_copy_is_served_until_an_invalidation_drops_it(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock, FakeTracking()), _store(redis, clock)
    session = await _begun(there, ids, clock)
    assert await _level(here, ids, session, clock) is None  # read, and kept
    session.log_level = "debug"
    await there.save(session, ("log_level",))
    assert await _level(here, ids, session, clock) is None  # the copy: nobody said it changed
    assert here.copies_served == 1
    here.invalidated([here._record(session.id).encode()])  # what Redis says after the save
    assert await _level(here, ids, session, clock) == "debug"
    assert await _level(here, ids, session, clock) == "debug"
    assert here.copies_served == 2


async def test_a_tombstone_or_a_flush_drops_the_copy_too(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock, FakeTracking()), _store(redis, clock)
    session = await _begun(there, ids, clock)
    await here.load(_described(ids, session.id, clock))
    await there.remove(session.id)
    here.invalidated([there._tombstone(session.id).encode(), b"mep:{other}:c:1"])
    assert await here.load(_described(ids, session.id, clock)) is None
    other = await _begun(there, ids, clock)
    await here.load(_described(ids, other.id, clock))
    here.invalidated(None)  # FLUSHDB: every key
    served = here.copies_served
    await here.load(_described(ids, other.id, clock))
    assert here.copies_served == served


async def test_no_copy_is_served_while_the_tracking_is_not_healthy(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    tracking = FakeTracking()
    here, there = _store(redis, clock, tracking), _store(redis, clock)
    session = await _begun(there, ids, clock)
    await here.load(_described(ids, session.id, clock))
    tracking.up = False  # down, or silent past its heartbeat: changes may be missed
    session.log_level = "error"
    await there.save(session, ("log_level",))
    assert await _level(here, ids, session, clock) == "error"
    assert here.copies_served == 0
    # ... and nothing read meanwhile is kept for when it is back: the reconnection resets.
    tracking.up, tracking.epoch = True, 2
    here.reset()
    assert await _level(here, ids, session, clock) == "error"
    assert here.copies_served == 0
    assert await _level(here, ids, session, clock) == "error"
    assert here.copies_served == 1


async def test_a_read_overtaken_by_a_change_is_not_kept(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock, FakeTracking()), _store(redis, clock)
    session = await _begun(there, ids, clock)
    real = here._load

    async def overtaken(keys: Any, args: Any) -> Any:
        found = await real(keys=keys, args=args)  # read before the change ...
        session.log_level = "debug"
        await there.save(session, ("log_level",))
        here.invalidated([keys[0].encode()])  # ... whose invalidation came before the answer
        return found

    here._load = overtaken  # type: ignore[assignment]
    assert await _level(here, ids, session, clock) is None
    here._load = real
    assert await _level(here, ids, session, clock) == "debug"  # not the copy of the read above
    assert here.copies_served == 0


async def test_a_read_across_a_reconnection_is_not_kept(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    tracking = FakeTracking()
    here = _store(redis, clock, tracking)
    session = await _begun(here, ids, clock)
    real = here._load

    async def across(keys: Any, args: Any) -> Any:
        tracking.epoch += 2  # lost and found again while the read was under way
        return await real(keys=keys, args=args)

    here._load = across  # type: ignore[assignment]
    await here.load(_described(ids, session.id, clock))
    here._load = real
    await here.load(_described(ids, session.id, clock))
    assert here.copies_served == 0


async def test_the_ttl_slides_once_per_slack_not_per_request(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here = _store(redis, clock, FakeTracking())
    session = await _begun(here, ids, clock)
    key = here._record(session.id)
    assert await redis.pttl(key) > IDLE * 1000  # the idle timeout and its slack
    await redis.pexpire(key, int(IDLE * 1000) + 5000)  # as if used a while ago: more than the idle timeout left
    for _ in range(3):
        await here.load(_described(ids, session.id, clock))
    assert await redis.pttl(key) <= int(IDLE * 1000) + 5000  # not slid: the session outlives IDLE anyway
    clock.now += 6  # now less than the idle timeout is left, as this replica knows it
    served = here.copies_served
    await redis.pexpire(key, int(IDLE * 1000) - 1000)
    await here.load(_described(ids, session.id, clock))
    assert here.copies_served == served  # not from the copy: the read slides it
    assert await redis.pttl(key) > IDLE * 1000


async def test_a_store_without_tracking_reads_every_time(clock: Clock, ids: SessionIds) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here = _store(redis, clock)
    session = await _begun(here, ids, clock)
    for _ in range(3):
        await here.load(_described(ids, session.id, clock))
    assert here.copies_served == 0 and not here._copies


def test_resp_values_are_parsed_as_they_complete() -> None:
    message = b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*2\r\n$6\r\nmep:{a\r\n$1\r\nb\r\n"
    buf, seen = bytearray(), []
    for byte in message:  # a byte at a time: one value, once it is whole
        buf.append(byte)
        seen += parse(buf)
    assert seen == [[b"message", b"__redis__:invalidate", [b"mep:{a", b"b"]]] and not buf
    buf = bytearray(message[:-3])
    assert parse(buf) == [] and bytes(buf) == message[:-3]  # incomplete: kept whole
    buf += message[-3:] + b":3\r\n+OK\r\n-ERR no\r\n$-1\r\n*-1\r\n"
    values = parse(buf)
    assert values[0] == [b"message", b"__redis__:invalidate", [b"mep:{a", b"b"]]
    assert values[1:3] == [3, b"OK"]
    assert isinstance(values[3], RespError) and str(values[3]) == "ERR no"
    assert values[4:] == [None, None] and not buf
    assert command("PING", 3) == b"*2\r\n$4\r\nPING\r\n$1\r\n3\r\n"


async def test_a_copy_of_a_session_whose_core_the_store_holds_serves_that_core_too(
    clock: Clock, ids: SessionIds
) -> None:
    redis = fakeredis.FakeAsyncRedis()
    here, there = _store(redis, clock, FakeTracking()), _store(redis, clock)
    core = SessionCore("2025-06-18", "2026-07-28", {}, {}, {}, {"name": "host", "icon": "x" * 5000})
    session = _described(ids, ids.mint(ALICE, core), clock)
    assert session.core_in_store and session.client_info is None
    session.client_info, session.legacy_version, session.log_level = core.client_info, core.legacy_version, "info"
    await there.add(session)
    for served in (0, 1, 2):  # read, then its copy twice
        loaded = await here.load(_described(ids, session.id, clock))
        assert loaded is not None and here.copies_served == served
        assert (loaded.client_info, loaded.legacy_version, loaded.log_level) == (core.client_info, "2025-06-18", "info")
        assert loaded.last_seen == clock.now
        clock.now += 1
