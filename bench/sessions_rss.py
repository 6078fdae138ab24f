"""Resident memory of one process per idle legacy session: open N sessions (initialize only, no
GET stream, nothing else), read VmRSS from /proc before and after.

    python -m bench.sessions_rss --url http://127.0.0.1:8080/mcp --pid PID [--count 10000]

Prints one JSON line: {"before_kb", "after_kb", "opened", "failed", "seconds", "kb_per_session"}.
`--warmup` sessions are opened first and not counted, so one-time allocations (imports, caches,
the first upstream discover) do not count against the sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import aiohttp

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "bench-sessions", "version": "1.0.0"},
    },
}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def open_sessions(url: str, count: int, concurrency: int, deadline: float) -> tuple[int, int]:
    opened = failed = 0
    remaining = iter(range(count))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:

        async def worker() -> None:
            nonlocal opened, failed
            for _ in remaining:
                if time.monotonic() > deadline:
                    return
                try:
                    async with http.post(url, json=INITIALIZE, headers=HEADERS) as response:
                        await response.read()
                        if response.status == 200 and "Mcp-Session-Id" in response.headers:
                            opened += 1
                        else:
                            failed += 1
                except (aiohttp.ClientError, TimeoutError):
                    failed += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return opened, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the process whose RSS is measured (the proxy)")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--time-limit", type=float, default=120.0, help="stop opening sessions after this long")
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + args.time_limit
    asyncio.run(open_sessions(args.url, args.warmup, args.concurrency, deadline))
    time.sleep(0.5)
    before = rss_kb(args.pid)
    begun = time.monotonic()
    opened, failed = asyncio.run(open_sessions(args.url, args.count, args.concurrency, deadline))
    seconds = time.monotonic() - begun
    time.sleep(0.5)
    after = rss_kb(args.pid)
    print(
        json.dumps(
            {
                "before_kb": before,
                "after_kb": after,
                "opened": opened,
                "failed": failed,
                "seconds": round(seconds, 2),
                "kb_per_session": round((after - before) / opened, 3) if opened else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
