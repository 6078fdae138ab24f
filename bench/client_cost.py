"""What the upstream side of one `tools/call` costs a Python client: aiohttp's ClientSession (what the
bare hop (b) uses), the proxy's own requests on aiohttp's connections (proxy/upstream/wire.py), and
the floor, a bare asyncio protocol on a kept-alive connection.

    python -m bench.client_cost [--requests 8000] [--repeat 3]

Starts the bench upstream (modern) on 127.0.0.1 and, in this process, sends `--requests` calls at 8
in flight each way (after 100 unrecorded per connection), every reply read and parsed with orjson.
CPU µs per request is this process's CPU time (user + system, the event loop and its system calls
included) over the calls. The floor writes the same request bytes on 8 connections and reads a
reply by its Content-Length: no chunked bodies, no streams, no pool, no timeouts, no TLS, so no
client that a proxy could ship costs this little; it says how much of aiohttp's cost is the client's
own work, the part a leaner upstream client could save. Prints one line per repeat and way.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from bench import servers
from bench.harness import BENCH, begin, machine, say

IN_FLIGHT = 8
WARMUP = 100
BODY = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "echo",
            "arguments": {"message": "hi"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
)
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "echo",
}


async def timed(worker: Callable[[int], Coroutine[Any, Any, None]], requests: int) -> float:
    """CPU µs per request of `requests` calls made by IN_FLIGHT workers."""
    await asyncio.gather(*(worker(WARMUP) for _ in range(IN_FLIGHT)))
    started = time.process_time()
    await asyncio.gather(*(worker(requests // IN_FLIGHT) for _ in range(IN_FLIGHT)))
    return (time.process_time() - started) / requests * 1e6


async def with_aiohttp(url: str, requests: int) -> float:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def worker(count: int) -> None:
            for _ in range(count):
                async with session.post(url, data=BODY, headers=HEADERS) as response:
                    orjson.loads(await response.read())

        return await timed(worker, requests)


async def with_wire(url: str, requests: int) -> float:
    """The proxy's way: the same requests written onto the session's pooled connections."""
    from proxy.upstream.wire import Requests, Target

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        wire, target = Requests(session, {}), Target(url)

        async def worker(count: int) -> None:
            for _ in range(count):
                reply = await wire.send("POST", target, BODY, HEADERS)
                orjson.loads(await reply.content.read())
                reply.close()

        return await timed(worker, requests)


class _Replies(asyncio.Protocol):
    """Replies with a Content-Length, one at a time: the floor's reader."""

    def __init__(self) -> None:
        self.buffer = b""
        self.waiter: asyncio.Future[bytes] | None = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:") + len(b"content-length:")
        length = int(head[at:].split(b"\r\n", 1)[0])
        if len(self.buffer) - end - 4 >= length:
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            self.waiter.set_result(body)


async def floor(url: str, requests: int) -> float:
    loop = asyncio.get_running_loop()
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in HEADERS.items())
    message = f"{head}Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY
    connections = [await loop.create_connection(_Replies, host, port) for _ in range(IN_FLIGHT)]
    free = list(connections)

    async def worker(count: int) -> None:
        transport, replies = free.pop()
        try:
            for _ in range(count):
                replies.waiter = loop.create_future()
                transport.write(message)
                orjson.loads(await replies.waiter)
        finally:
            free.append((transport, replies))

    try:
        return await timed(worker, requests)
    finally:
        for transport, _ in connections:
            transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.client_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        import uvloop

        run: Callable[[Coroutine[Any, Any, float]], float] = uvloop.run
    except ImportError:
        run = asyncio.run
    _, procs, _, _ = begin(Path(BENCH / "results"), machine)
    try:
        with servers.upstream(procs, "modern") as (url, _):
            for index in range(args.repeat):
                aiohttp_us = run(with_aiohttp(url, args.requests))
                wire_us = run(with_wire(url, args.requests))
                floor_us = run(floor(url, args.requests))
                say(
                    f"run {index + 1}/{args.repeat}: CPU µs per request: aiohttp ClientSession {aiohttp_us:.1f}, "
                    f"the proxy's requests on its connections {wire_us:.1f}, bare protocol (the floor) {floor_us:.1f}"
                )
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
