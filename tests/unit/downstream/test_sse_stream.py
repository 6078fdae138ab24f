"""An SSE reply's keep-alive (proxy/downstream/reply.py `SseStream`): comments while the stream is
quiet, from a timer, with no task of its own between them (a legacy session's GET stream is one,
held open by the thousand)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from proxy.downstream.reply import SseStream
from proxy.protocol.sse import KEEPALIVE

WAIT_S = 5.0


class Served:
    def __init__(self) -> None:
        self.tasks_added: list[int] = []  # tasks alive once a stream started, beyond those before
        self.done = asyncio.Event()  # the test has seen what it waits for


@pytest.fixture
async def served() -> AsyncIterator[tuple[Served, str]]:
    state = Served()

    async def handler(request: web.Request) -> web.StreamResponse:
        sse = SseStream(request, keepalive_s=0.02)
        before = len(asyncio.all_tasks())
        response = await sse.start()
        state.tasks_added.append(len(asyncio.all_tasks()) - before)
        try:
            await state.done.wait()
        finally:
            sse.abort()
        return response

    app = web.Application()
    app.router.add_get("/sse", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield state, f"http://127.0.0.1:{runner.addresses[0][1]}/sse"
    finally:
        state.done.set()
        await runner.cleanup()


async def test_a_quiet_stream_gets_keepalive_comments_and_keeps_no_task_between_them(
    served: tuple[Served, str],
) -> None:
    state, url = served
    async with aiohttp.ClientSession() as client, client.get(url) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        seen = b""
        async with asyncio.timeout(WAIT_S):
            while seen.count(KEEPALIVE) < 3:
                seen += await response.content.readany()
        assert seen.replace(KEEPALIVE, b"") == b""  # nothing but keep-alive comments
        state.done.set()
    assert state.tasks_added == [0]
