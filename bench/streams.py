"""The cost of legacy GET streams: N legacy sessions of one caller, each holding its GET stream,
in front of a 2026-07-28 upstream that serves `subscriptions/listen` (bench/upstream.py --listen).

    python -m bench.streams [--sessions 1000] [--tree PATH] [--time-limit 300] [--tracemalloc]

Starts the upstream and the proxy (this tree's, or `--tree`'s: the before figure of another
checkout), each in a process group of its own stopped by its pid at the end. Then, at each stage
(`base`: one warm-up session; `sessions`: N sessions initialized; `streams`: each holding a GET
stream; `subscribed`: most subscribed to one of 8 resources, session i to `bench://resource/{i % 8}`
unless i % 5 == 0), it reads the proxy's VmRSS and open descriptors (/proc/<pid>/status, fd/), the
ESTABLISHED TCP connections from the proxy to the upstream's port (/proc/<pid>/net/tcp, matched
to the proxy's own socket inodes; idle pooled connections count too) and the listens the upstream
holds open. Last, the upstream pushes a tools list change, an update of each resource and a
prompts list change: every session must receive exactly the list changes and the update of its
own resource, in that order (`wrong` counts those that did not).

Prints one JSON line: the stages, `kb_per_stream` ((streams - sessions) RSS / N),
`kb_per_session_with_stream` ((subscribed - base) / N), and the check. With `--tracemalloc`, the
proxy runs under tracemalloc (bench/traced.py), a snapshot is taken at each stage, and the line
also holds what a session and what a stream hold, in bytes, by where the proxy made it
(`tracemalloc`: per_session, the sessions stage over base; per_stream, streams over sessions); the
RSS figures of such a run include tracemalloc's own bookkeeping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench import servers, traced
from bench.harness import BENCH, begin, say

CALLER = {"Authorization": "Bearer bench-streams-caller"}
ACCEPT = "application/json, text/event-stream"
VERSION = "2025-11-25"
RESOURCES = 8
TOOLS_CHANGED = "notifications/tools/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"


def resource_of(index: int) -> str | None:
    """The resource session `index` subscribes to (None: it subscribes to none)."""
    return None if index % 5 == 0 else f"bench://resource/{index % RESOURCES}"


def expected(index: int) -> list[tuple[str, str | None]]:
    uri = resource_of(index)
    return [(TOOLS_CHANGED, None), *([(UPDATED, uri)] if uri else []), (PROMPTS_CHANGED, None)]


# ---------------------------------------------------------------- what the proxy holds


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def socket_inodes(pid: int) -> tuple[int, set[str]]:
    """How many descriptors the process holds open, and the inodes of its sockets."""
    inodes: set[str] = set()
    fds = os.listdir(f"/proc/{pid}/fd")
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return len(fds), inodes


def connections_to(pid: int, port: int, inodes: set[str]) -> int:
    """ESTABLISHED TCP connections of the process (its socket inodes) to `port`."""
    count = 0
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                count += 1
    return count


Snapshot = Callable[[], Awaitable[None]]  # a tracemalloc snapshot of the proxy, taken once it is written


def snapshots(pid: int, directory: Path) -> Snapshot:
    """Signals the proxy under bench/traced.py to write its next snapshot, and waits for it (60 s)."""
    taken = 0

    async def take() -> None:
        nonlocal taken
        path = traced.snapshot_path(directory, taken)
        os.kill(pid, signal.SIGUSR1)
        for _ in range(300):  # a file appears whole (renamed once written): polled, 60 s at most
            if path.exists():
                break
            await asyncio.sleep(0.2)
        else:
            raise TimeoutError(f"no snapshot {path.name} from the proxy in 60 s")
        taken += 1

    return take


async def stage(
    http: aiohttp.ClientSession, pid: int, upstream_port: int, stats_url: str, snapshot: Snapshot | None
) -> dict[str, int]:
    await asyncio.sleep(1.0)  # what was just opened settles (acks, closed listens)
    fds, inodes = socket_inodes(pid)
    async with http.get(stats_url) as response:
        stats = await response.json()
    if snapshot is not None:
        await snapshot()
    return {
        "rss_kb": rss_kb(pid),
        "fds": fds,
        "upstream_connections": connections_to(pid, upstream_port, inodes),
        "upstream_listens_open": int(stats.get("listens_open", 0)),
    }


# ---------------------------------------------------------------- the clients


class Session:
    def __init__(self, index: int, session_id: str) -> None:
        self.index = index
        self.session_id = session_id
        self.received: list[tuple[str, str | None]] = []
        self.done = asyncio.Event()  # the last notification pushed (the marker) arrived
        self.reader: asyncio.Task[None] | None = None

    def headers(self) -> dict[str, str]:
        return {**CALLER, "Accept": ACCEPT, "Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": VERSION}

    async def read(self, response: aiohttp.ClientResponse) -> None:
        data: list[str] = []
        async for raw in response.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif not line and data:
                message = json.loads("\n".join(data))
                data = []
                method = message.get("method")
                self.received.append((method, (message.get("params") or {}).get("uri")))
                if method == PROMPTS_CHANGED:
                    self.done.set()


async def post(http: aiohttp.ClientSession, url: str, message: dict[str, Any], headers: dict[str, str]) -> Any:
    async with http.post(url, json=message, headers=headers) as response:
        body = await response.read()
        if response.status >= 300:
            raise RuntimeError(f"{message.get('method')}: HTTP {response.status} {body[:200]!r}")
        if not body or "id" not in message:
            return response.headers.get("Mcp-Session-Id")
        text = body.decode()
        if response.content_type == "text/event-stream":  # the first event with data: a priming one has none
            text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip())
        reply = json.loads(text)
        if "error" in reply:
            raise RuntimeError(f"{message.get('method')}: {reply['error']}")
        return response.headers.get("Mcp-Session-Id")


async def initialize(http: aiohttp.ClientSession, url: str, index: int) -> Session:
    params = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "bench-streams", "version": "1"}}
    session_id = await post(
        http, url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}, {**CALLER, "Accept": ACCEPT}
    )
    session = Session(index, session_id)
    await post(http, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session.headers())
    return session


async def open_stream(http: aiohttp.ClientSession, url: str, session: Session) -> None:
    response = await http.get(url, headers=session.headers())
    if response.status != 200:
        raise RuntimeError(f"GET stream: HTTP {response.status}")
    session.reader = asyncio.create_task(session.read(response))


async def subscribe(http: aiohttp.ClientSession, url: str, session: Session) -> None:
    uri = resource_of(session.index)
    if uri is not None:
        message = {"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": uri}}
        await post(http, url, message, session.headers())


async def each(items: list[Any], work: Any, concurrency: int = 32) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(item: Any) -> Any:
        async with gate:
            return await work(item)

    return await asyncio.gather(*(one(item) for item in items))


async def measure(url: str, pid: int, upstream: str, count: int, snapshot: Snapshot | None = None) -> dict[str, Any]:
    base_url = upstream.rsplit("/", 1)[0]
    upstream_port = int(base_url.rsplit(":", 1)[1])
    stats_url, notify_url = f"{base_url}/stats", f"{base_url}/notify"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        await initialize(http, url, -1)  # the upstream's discover cached, the first allocations made
        stages = {"base": await stage(http, pid, upstream_port, stats_url, snapshot)}
        began = time.monotonic()
        sessions = await each(list(range(count)), lambda index: initialize(http, url, index))
        stages["sessions"] = await stage(http, pid, upstream_port, stats_url, snapshot)
        await each(sessions, lambda session: open_stream(http, url, session))
        stages["streams"] = await stage(http, pid, upstream_port, stats_url, snapshot)
        await each(sessions, lambda session: subscribe(http, url, session))
        stages["subscribed"] = await stage(http, pid, upstream_port, stats_url, snapshot)
        opened_s = time.monotonic() - began
        pushes = [(TOOLS_CHANGED, None)]
        pushes += [(UPDATED, f"bench://resource/{n}") for n in range(RESOURCES)]
        pushes.append((PROMPTS_CHANGED, None))
        pushed = []
        for method, uri in pushes:
            async with http.post(notify_url, json={"method": method, "params": {"uri": uri} if uri else {}}) as reply:
                pushed.append((await reply.json())["pushed"])
        try:
            async with asyncio.timeout(60):
                await asyncio.gather(*(session.done.wait() for session in sessions))
        except TimeoutError:
            pass
        wrong = [session for session in sessions if session.received != expected(session.index)]
        for session in sessions:
            if session.reader is not None:
                session.reader.cancel()
    streams, before = stages["streams"], stages["sessions"]
    return {
        "sessions": count,
        "stages": stages,
        "kb_per_stream": round((streams["rss_kb"] - before["rss_kb"]) / count, 2),
        "kb_per_session_with_stream": round((stages["subscribed"]["rss_kb"] - stages["base"]["rss_kb"]) / count, 2),
        "fds_per_stream": round((streams["fds"] - before["fds"]) / count, 2),
        "opened_s": round(opened_s, 1),
        "pushed_to_upstream_listens": pushed,
        "received_exactly_what_they_subscribed_to": count - len(wrong),
        "wrong": len(wrong),
        "wrong_examples": [
            {"index": s.index, "expected": expected(s.index), "received": s.received} for s in wrong[:3]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--tree", type=Path, help="run that checkout's proxy (e.g. a worktree of main)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="give up after this long")
    parser.add_argument("--tracemalloc", action="store_true", help="what a session and a stream hold, by where")
    args = parser.parse_args()
    _, procs, _, _ = begin(BENCH / "results", lambda: {"cores": str(os.cpu_count())})
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as trace_dir:
        proxy_options: dict[str, Any] = {}
        if args.tracemalloc:
            launcher = (sys.executable, str(Path(traced.__file__).resolve()))
            proxy_options = {"launcher": launcher, "env": {"BENCH_TRACE_DIR": trace_dir}, "timeout": 120.0}
        try:
            argv = [sys.executable, "-m", "bench.upstream", "--port", "0", "--era", "modern", "--listen"]
            with procs.listening("streams-upstream", argv) as upstream_process:
                upstream = f"http://127.0.0.1:{upstream_process.port}/mcp"
                with servers.proxy(procs, "streams", url=upstream, era="modern", tree=args.tree, **proxy_options) as (
                    url,
                    pid,
                ):
                    say(f"{args.sessions} legacy sessions of one caller, each with a GET stream, proxy pid {pid}")
                    snapshot = snapshots(pid, Path(trace_dir)) if args.tracemalloc else None
                    run = measure(url, pid, upstream, args.sessions, snapshot)
                    result = asyncio.run(asyncio.wait_for(run, args.time_limit))
        finally:
            procs.stop_all()
        if args.tracemalloc:
            base, sessions, streams = (traced.snapshot_path(Path(trace_dir), n) for n in range(3))
            result["tracemalloc"] = {
                "per_session": traced.held_beyond(base, sessions, args.sessions),
                "per_stream": traced.held_beyond(sessions, streams, args.sessions),
            }
    result["tree"] = str(args.tree or "this checkout")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
