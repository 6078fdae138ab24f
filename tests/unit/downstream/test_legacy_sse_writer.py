"""The writer of an HTTP+SSE event stream (proxy/downstream/legacy_sse.py `StreamWriter`, written
through downstream/reply.py `SseStream`): messages in order as `message` events, keep-alive comments
while quiet (from a timer: no task of the stream's own between them), a client gone noticed on a
quiet stream, a client that does not read cut off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from structlog.testing import capture_logs

from proxy.downstream import legacy_sse
from proxy.downstream.legacy_sse import StreamWriter
from proxy.protocol.sse import KEEPALIVE

WAIT_S = 5.0


class Served:
    def __init__(self) -> None:
        self.writers: list[StreamWriter] = []
        self.pumped: asyncio.Event = asyncio.Event()  # a handler's pump has returned
        self.tasks_added: list[int] = []  # tasks alive once a stream started, beyond those before


@pytest.fixture
async def served() -> AsyncIterator[tuple[Served, str]]:
    state = Served()

    async def handler(request: web.Request) -> web.StreamResponse:
        writer = StreamWriter(request, keepalive_s=0.05)
        state.writers.append(writer)
        writer.write({"jsonrpc": "2.0", "method": "one"})
        writer.write_raw(b'{"jsonrpc":"2.0","method":"two"}')
        before = len(asyncio.all_tasks())
        await writer.stream.start()
        state.tasks_added.append(len(asyncio.all_tasks()) - before)
        try:
            await writer.pump()
        finally:
            state.pumped.set()
            writer.stream.abort()
        return await writer.stream.close()

    app = web.Application()
    app.router.add_get("/sse", handler)
    # Without handler cancellation (the proxy's listener has it): a client gone leaves the handler
    # running, so only the stream itself can notice.
    runner = web.AppRunner(app, handler_cancellation=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield state, f"http://127.0.0.1:{runner.addresses[0][1]}/sse"
    finally:
        await runner.cleanup()


async def test_messages_come_in_order_then_keepalives_while_quiet_and_end_ends_the_stream(
    served: tuple[Served, str],
) -> None:
    state, url = served
    async with aiohttp.ClientSession() as client, client.get(url) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        seen = b""
        async with asyncio.timeout(WAIT_S):
            while seen.count(KEEPALIVE) < 2:
                seen += await response.content.readany()
        events = seen.split(b"\n\n")
        assert events[0] == b'event: message\ndata: {"jsonrpc":"2.0","method":"one"}'
        assert events[1] == b'event: message\ndata: {"jsonrpc":"2.0","method":"two"}'
        assert state.tasks_added == [0]  # the keep-alive is a timer (a task sleeping was 1.7 KB a stream)
        state.writers[0].end()
        async with asyncio.timeout(WAIT_S):
            while await response.content.readany():
                pass  # the end of the stream
    assert state.pumped.is_set()


async def test_a_client_gone_from_a_quiet_stream_is_noticed_by_its_keepalive(served: tuple[Served, str]) -> None:
    state, url = served
    async with aiohttp.ClientSession() as client, client.get(url) as response:
        await response.content.readany()
    async with asyncio.timeout(WAIT_S):  # nothing is queued: only a keep-alive can fail
        await state.pumped.wait()
    assert state.writers[0].broken.is_set()


async def test_a_client_that_does_not_read_is_cut_off_past_the_bound() -> None:
    # No pump runs, as when a write waits on a client that does not read: the queue fills up.
    writer = StreamWriter(make_mocked_request("GET", "/sse"), keepalive_s=10.0)
    with capture_logs() as logs:
        for n in range(legacy_sse._MAX_QUEUED + 5):
            writer.write({"jsonrpc": "2.0", "method": "m", "params": {"n": n}})
    assert writer.broken.is_set()
    assert [entry["event"] for entry in logs] == ["sse_client_not_reading"]
    assert logs[0]["queued"] == legacy_sse._MAX_QUEUED
    assert writer._queue.qsize() == legacy_sse._MAX_QUEUED + 1  # what was queued, then the end
