"""Shutdown: calls in flight get `shutdown.grace_s`, then those still running are cut with an error
that says so; a grace of 0 cuts them at once (aiohttp would read 0 as no limit)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.config import load_settings
from proxy.downstream.server import runner as make_runner
from tests.support.fake_modern import FakeModern, Outcome, complete, hang
from tests.support.legacy_client import initialize_message
from tests.support.mcp_client import ACCEPT
from tests.support.modern_client import ModernClient


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


async def _served(settings_overrides: dict[str, object], fake: FakeModern) -> tuple[web.AppRunner, str]:
    settings = load_settings(
        None, **{"upstream.url": fake.url, "upstream.era": "modern", "cache.watch": False, **settings_overrides}
    )
    app, _ = create_app(settings)
    runner = make_runner(app, settings)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"


async def _reply(response: aiohttp.ClientResponse) -> tuple[int, dict[str, object]]:
    """The HTTP status and the JSON-RPC message that ends a reply (JSON, or an SSE stream's last)."""
    text = await response.text()
    if response.content_type == "text/event-stream":
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return response.status, json.loads(data[-1])
    return response.status, json.loads(text)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse-started"])
async def test_calls_still_running_when_the_grace_ends_get_a_shutdown_error_and_short_ones_finish(
    fake: FakeModern, streamed: bool
) -> None:
    """SIGTERM with calls in flight: the one that ends within `shutdown.grace_s` is answered; a
    legacy client's and a modern client's long calls each get -32014 (HTTP 503, or a last SSE event
    when their reply had started), not a closed connection; one grace, not two."""

    async def slowish(call: Any) -> Outcome:
        await asyncio.sleep(0.3)
        return complete(content=[{"type": "text", "text": "done"}])

    async def long(call: Any) -> Outcome:
        if call.params.get("name") == "short":
            return await slowish(call)
        return await hang(call)

    fake.handlers["tools/call"] = long
    grace = 1.0
    # A reply quiet for `keepalive` becomes an SSE stream; a 2025-11-25 client's sooner (its
    # priming event, within 1 s), a 2025-06-18 client's not.
    keepalive, version = (0.2, "2025-11-25") if streamed else (30.0, "2025-06-18")
    runner, url = await _served({"shutdown.grace_s": grace, "streams.keepalive_s": keepalive}, fake)
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=initialize_message(version), headers={"Accept": ACCEPT}) as response:
            session = response.headers["Mcp-Session-Id"]
        legacy = {"Accept": ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": version}

        def call(request_id: int, name: str) -> dict[str, object]:
            return {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": name, "arguments": {}},
            }

        async def legacy_call(request_id: int, name: str) -> tuple[int, dict[str, object]]:
            async with http.post(url, json=call(request_id, name), headers=legacy) as response:
                return await _reply(response)

        modern = ModernClient(None)  # type: ignore[arg-type]  # only builds messages
        modern_message = modern.message("tools/call", {"name": "long-modern", "arguments": {}}, id=3)

        async def modern_call() -> tuple[int, dict[str, object]]:
            async with http.post(url, json=modern_message, headers=modern.headers(modern_message)) as response:
                return await _reply(response)

        calls = [
            asyncio.create_task(legacy_call(1, "short")),
            asyncio.create_task(legacy_call(2, "long-legacy")),
            asyncio.create_task(modern_call()),
        ]
        for _ in range(3):
            await fake.next_call("tools/call")
        if streamed:
            await asyncio.sleep(keepalive * 2)  # the long replies have started (a keep-alive sent)
        async with asyncio.timeout(grace + 4.0):  # one grace and the cut; it waited two before
            await runner.cleanup()
            (short_status, short), (legacy_status, cut_legacy), (modern_status, cut_modern) = await asyncio.gather(
                *calls
            )
    assert short_status == 200 and short["result"]["content"][0]["text"] == "done"  # type: ignore[index]
    # The legacy reply had started when `streamed` (keep-alives); the modern one, relayed byte for
    # byte, starts only with the server's reply, so it is a 503 either way.
    for status, reply, request_id, expected in (
        (legacy_status, cut_legacy, 2, 200 if streamed else 503),
        (modern_status, cut_modern, 3, 503),
    ):
        assert status == expected, (status, reply)
        assert reply["id"] == request_id
        assert reply["error"]["code"] == -32014 and "shutting down" in reply["error"]["message"]  # type: ignore[index]
