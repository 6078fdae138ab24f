"""A legacy session's live part (proxy/relay/runtime.py): its GET streams as their handlers drain them,
what is kept for a stream not open yet, and what waits for `initialized`."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable

import pytest

from proxy.errors import ProxyError
from proxy.relay.runtime import GetStream, SessionRuntime

WAIT = 5.0


def note(n: int) -> dict[str, object]:
    return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}}


def bytes_each(make: Callable[[], object], count: int = 1000) -> float:
    """What each of `count` objects made by `make` holds, as tracemalloc counts it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = [make() for _ in range(count)]
        return (tracemalloc.get_traced_memory()[0] - before) / len(made)
    finally:
        tracemalloc.stop()


async def test_messages_come_out_in_order_and_close_ends_the_stream() -> None:
    stream = GetStream()
    for n in range(3):
        stream.put(note(n))
    stream.close()
    stream.put(note(99))  # after the end: never read, the handler has stopped
    async with asyncio.timeout(WAIT):
        got = [await stream.get() for _ in range(4)]
    assert got == [note(0), note(1), note(2), None]


async def test_a_reader_waits_for_the_next_message_and_wakes_for_it() -> None:
    stream = GetStream()
    reader = asyncio.create_task(stream.get())
    await asyncio.sleep(0)
    assert not reader.done()
    stream.put(note(1))
    async with asyncio.timeout(WAIT):
        assert await reader == note(1)
    reader = asyncio.create_task(stream.get())
    await asyncio.sleep(0)
    stream.close()
    async with asyncio.timeout(WAIT):
        assert await reader is None


async def test_a_reader_cancelled_while_waiting_leaves_the_stream_usable() -> None:
    stream = GetStream()
    reader = asyncio.create_task(stream.get())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    stream.put(note(2))  # no waiter left behind to wake
    async with asyncio.timeout(WAIT):
        assert await stream.get() == note(2)


async def test_a_long_burst_is_drained_whole_and_in_order_across_refills() -> None:
    stream = GetStream()
    got: list[object] = []
    for burst in range(5):
        for n in range(500):
            stream.put(note(burst * 1000 + n))
        async with asyncio.timeout(WAIT):
            for _ in range(250):  # half of it, then more arrives behind the rest
                got.append(await stream.get())
    stream.close()
    async with asyncio.timeout(WAIT):
        while (message := await stream.get()) is not None:
            got.append(message)
    assert got == [note(b * 1000 + n) for b in range(5) for n in range(500)]


def test_an_idle_stream_is_small() -> None:
    """Held per session by the thousand (bench/streams.py): an idle stream is a few hundred bytes
    (an asyncio.Queue alone is some 2.5 KB: four deques)."""
    per_stream = bytes_each(GetStream)
    assert per_stream < 300, per_stream


async def test_the_session_hands_a_message_to_its_newest_stream_or_keeps_it_for_the_next() -> None:
    runtime: SessionRuntime[None] = SessionRuntime("s", None, backlog_size=10)
    runtime.deliver(note(0))  # no stream yet: kept
    first = runtime.open_stream(limit=2)
    second = runtime.open_stream(limit=2)
    runtime.deliver(note(1))
    async with asyncio.timeout(WAIT):
        assert await first.get() == note(0)
        assert await second.get() == note(1)
    with pytest.raises(ProxyError) as refused:
        runtime.open_stream(limit=2)
    assert refused.value.status == 409


def test_an_idle_session_runtime_is_small() -> None:
    """Held per session by the thousand (bench/streams.py): what most sessions never use (the
    backlog for a stream not open yet, what waits for `initialized`) is not made for them, and the
    session's task scope is a dict (an empty set is 216 bytes); the runtime was some 2.4 KB with a
    deque and an asyncio.Event (another deque) each."""
    per_runtime = bytes_each(lambda: SessionRuntime("s", None, backlog_size=100))
    assert per_runtime < 600, per_runtime


async def test_a_backlog_past_its_size_keeps_the_latest_messages_for_the_next_stream_only() -> None:
    runtime: SessionRuntime[None] = SessionRuntime("s", None, backlog_size=2)
    for n in range(3):
        runtime.deliver(note(n))
    first = runtime.open_stream(limit=2)
    second = runtime.open_stream(limit=2)
    first.close()
    second.close()
    async with asyncio.timeout(WAIT):
        assert [await first.get() for _ in range(3)] == [note(1), note(2), None]
        assert await second.get() is None


async def test_what_waits_for_initialized_goes_on_when_it_comes_and_what_comes_later_does_not_wait() -> None:
    runtime: SessionRuntime[None] = SessionRuntime("s", None, backlog_size=2)
    assert not runtime.initialized
    waiting = [asyncio.create_task(runtime.wait_initialized()) for _ in range(2)]
    await asyncio.sleep(0)  # both are waiting
    assert not any(task.done() for task in waiting)
    runtime.mark_initialized()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*waiting)
        await runtime.wait_initialized()
    assert runtime.initialized
