"""Deadlines on reading a request (proxy/downstream/server.py): idle connections, headers and bodies
that arrive too slowly are closed, and a reply that outlasts them all is never cut.

The proxy is served here as the command line serves it (its runner, a TCP site on 127.0.0.1), in
front of the scripted modern upstream; clients are raw sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.config import load_settings
from proxy.downstream.server import runner
from proxy.protocol import jsonrpc
from tests.support.fake_modern import Call, FakeModern, Outcome, complete
from tests.support.legacy_client import LegacyClient
from tests.support.modern_client import ModernClient

WAIT = 10.0  # bound on every wait: the deadlines under test are tenths of a second
LONG = 30.0  # a deadline that must not be the one that acts

Serve = Callable[..., Awaitable[int]]


@pytest.fixture
async def serve_proxy(fake: FakeModern) -> AsyncIterator[Serve]:
    """`port = await serve_proxy(**settings)`: the proxy on 127.0.0.1, run by the CLI's runner."""
    runners: list[web.AppRunner] = []

    async def start(**overrides: Any) -> int:
        settings = load_settings(
            None,
            **{"upstream.url": fake.url, "upstream.era": "modern", "cache.watch": False, **overrides},
        )
        app, _ = create_app(settings)
        started = runner(app, settings)
        await started.setup()
        runners.append(started)
        site = web.TCPSite(started, "127.0.0.1", 0)
        await site.start()
        return started.addresses[0][1]

    yield start
    for started in runners:
        await started.cleanup()


@asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the proxy sends until it closes the connection (bounded)."""
    async with asyncio.timeout(WAIT):
        return await reader.read()


def timeout_reply(raw: bytes) -> dict[str, Any]:
    """The JSON-RPC error of a 408 reply that closes the connection."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), raw[:300]
    assert b"content-type: application/json" in head.lower()
    message = json.loads(body)
    assert message["error"]["code"] == jsonrpc.INVALID_REQUEST
    return message["error"]


def post_head(length: int) -> bytes:
    return (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n" % length
    )


async def test_an_idle_connection_is_closed_after_the_idle_timeout(serve_proxy: Serve):
    port = await serve_proxy(
        **{"downstream.idle_timeout_s": 0.2, "downstream.header_timeout_s": LONG, "downstream.body_timeout_s": LONG}
    )
    async with connection(port) as (reader, _):  # never sends a byte
        assert await until_closed(reader) == b""
    async with connection(port) as (reader, writer):  # idle after a reply, kept alive
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        raw = await until_closed(reader)
    assert raw.startswith(b"HTTP/1.1 200 ") and raw.count(b"HTTP/1.1") == 1


async def test_headers_sent_a_byte_at_a_time_get_408_and_the_connection_closed(serve_proxy: Serve):
    port = await serve_proxy(
        **{"downstream.idle_timeout_s": LONG, "downstream.header_timeout_s": 0.3, "downstream.body_timeout_s": LONG}
    )
    async with connection(port) as (reader, writer):

        async def trickle() -> None:  # slowloris: the headers never end, each byte comes late
            writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            with contextlib.suppress(ConnectionError):
                while True:
                    await asyncio.sleep(0.02)  # pacing the attack, not waiting for anything
                    writer.write(b"a")
                    await writer.drain()

        sender = asyncio.create_task(trickle())
        try:
            raw = await until_closed(reader)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    assert "headers" in timeout_reply(raw)["message"]


async def test_a_body_sent_too_slowly_gets_408_with_a_json_rpc_error_and_the_connection_closed(serve_proxy: Serve):
    port = await serve_proxy(
        **{"downstream.idle_timeout_s": LONG, "downstream.header_timeout_s": LONG, "downstream.body_timeout_s": 0.3}
    )
    async with connection(port) as (reader, writer):
        writer.write(post_head(1000) + b'{"jsonrpc": "2.0", ')  # and the rest never comes
        raw = await until_closed(reader)
    assert "body" in timeout_reply(raw)["message"]
    assert raw.count(b"HTTP/1.1") == 1


async def test_the_end_of_a_body_arms_no_header_deadline_on_a_connection_kept_alive(serve_proxy: Serve):
    port = await serve_proxy(
        **{"downstream.idle_timeout_s": LONG, "downstream.header_timeout_s": 0.3, "downstream.body_timeout_s": LONG}
    )
    async with connection(port) as (reader, writer):
        # Answered without its body being read; aiohttp then reads the body, arriving late, to its end.
        writer.write(b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n")
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:])
            await reader.readexactly(length)
        writer.write(b"hello")  # the body's end, on an otherwise idle connection
        async with connection(port) as (other, other_writer):  # outlasts a header deadline from now
            other_writer.write(b"GET /healthz HTTP/1.1\r\n")
            timeout_reply(await until_closed(other))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        async with asyncio.timeout(WAIT):
            answer = await reader.readuntil(b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 "), answer  # not a 408 for bytes that were a body


@pytest.mark.parametrize("client_era", ["modern", "legacy"])
async def test_a_reply_that_outlasts_every_read_deadline_is_not_cut(
    serve_proxy: Serve, fake: FakeModern, client_era: str
):
    deadline = 0.2
    port = await serve_proxy(
        **{
            "downstream.idle_timeout_s": deadline,
            "downstream.header_timeout_s": deadline,
            "downstream.body_timeout_s": deadline,
            "streams.keepalive_s": 0.05,  # a translated reply still pending becomes an SSE stream
        }
    )
    release = asyncio.Event()

    async def long_call(call: Call) -> Outcome:
        await release.wait()
        return complete(content=[{"type": "text", "text": "finished"}])

    fake.handlers["tools/call"] = long_call
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
        peer: Any = ModernClient(http) if client_era == "modern" else await LegacyClient.connect(http)  # type: ignore[arg-type]
        call = asyncio.create_task(peer.request("tools/call", {"name": "long", "arguments": {}}))
        async with asyncio.timeout(WAIT):
            await fake.next_call("tools/call")
            # Every deadline has passed meanwhile: connections opened now are closed by them.
            async with connection(port) as (idle, _):
                assert await until_closed(idle) == b""
            async with connection(port) as (slow, writer):
                writer.write(post_head(1000))
                timeout_reply(await until_closed(slow))
            assert not call.done()
            release.set()
            reply = await call
    assert reply.status == 200
    assert reply.content_type == ("text/event-stream" if client_era == "legacy" else "application/json")
    assert reply.result["content"] == [{"type": "text", "text": "finished"}]
