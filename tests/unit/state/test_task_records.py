"""The in-memory task store (proxy/state/task_records.py): records by caller and id, pages in creation
order, retention that ends records by itself. The clock is injected: no sleeps."""

from __future__ import annotations

from proxy.state.task_records import InMemoryTaskStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_records_are_kept_by_caller_and_id_and_replaced_in_place() -> None:
    store = InMemoryTaskStore(Clock())
    await store.put("alice", "t1", b"one", 1.0, 60)
    await store.put("bob", "t1", b"bob's", 1.0, 60)
    await store.put("alice", "t1", b"one, later", 1.0, 60)
    assert await store.get("alice", "t1") == b"one, later"
    assert await store.get("bob", "t1") == b"bob's"
    assert await store.get("carol", "t1") is None
    assert (await store.count("alice"), await store.count("bob")) == (1, 1)


async def test_pages_follow_creation_time_then_id_after_a_position() -> None:
    store = InMemoryTaskStore(Clock())
    for task_id, created in [("c", 3.0), ("a", 1.0), ("b2", 2.0), ("b1", 2.0)]:
        await store.put("alice", task_id, task_id.encode(), created, 60)
    assert await store.page("alice", None, 10) == [b"a", b"b1", b"b2", b"c"]
    assert await store.page("alice", None, 2) == [b"a", b"b1"]
    assert await store.page("alice", (2.0, "b1"), 2) == [b"b2", b"c"]
    assert await store.page("alice", (3.0, "c"), 2) == []
    assert await store.page("nobody", None, 2) == []


async def test_a_record_expires_with_its_retention_whoever_asks_next() -> None:
    clock = Clock()
    store = InMemoryTaskStore(clock)
    await store.put("alice", "short", b"s", 1.0, 5)
    await store.put("alice", "long", b"l", 2.0, 50)
    await store.put("bob", "other", b"o", 1.0, 5)
    await store.put("alice", "short", b"s2", 1.0, 4)  # put again: the retention it is given now counts
    clock.now += 4.5
    assert await store.get("alice", "short") is None
    clock.now += 1
    await store.put("carol", "x", b"x", 3.0, 60)  # any call ends what expired, for every caller
    assert store._records.keys() == {"alice", "carol"}
    assert await store.page("alice", None, 10) == [b"l"]
    assert await store.count("bob") == 0


async def test_removing_forgets_a_record_and_its_place() -> None:
    store = InMemoryTaskStore(Clock())
    await store.put("alice", "t1", b"1", 1.0, 60)
    await store.put("alice", "t2", b"2", 2.0, 60)
    await store.remove("alice", "t1")
    await store.remove("alice", "never")
    assert await store.page("alice", None, 10) == [b"2"]
    await store.remove("alice", "t2")
    assert await store.count("alice") == 0 and store._records == {}
