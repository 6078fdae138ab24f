"""A shutdown grace of 0 cancels the calls in flight at once (aiohttp would read 0 as no limit)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from proxy.app import create_app
from proxy.config import load_settings
from proxy.downstream.server import runner as make_runner
from tests.support.fake_modern import FakeModern, hang
from tests.support.legacy_peer import ACCEPT, initialize_message


async def test_a_grace_of_zero_cancels_a_call_in_flight_at_once(fake: FakeModern) -> None:
    fake.handlers["tools/call"] = hang
    settings = load_settings(
        None,
        **{"upstream.url": fake.url, "upstream.era": "modern", "cache.watch": False, "shutdown.grace_s": 0},
    )
    app, _ = create_app(settings)
    runner = make_runner(app, settings)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=initialize_message("2025-11-25"), headers={"Accept": ACCEPT}) as response:
            session = response.headers["Mcp-Session-Id"]
        headers = {"Accept": ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "slow", "arguments": {}}}
        pending = asyncio.create_task(http.post(url, json=call, headers=headers))
        await fake.next_call("tools/call")
        async with asyncio.timeout(5):  # without the fix: waits for the call forever
            await runner.cleanup()
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
