"""A stdio server slow to start (as `npx -y` on a cold cache), before and after: how soon a desktop
host's first `initialize` is answered, and how many server processes are started for it.

    python -m bench.slow_start --before REV [--after REV|worktree] [--delay 8] [--runs 2] [--rows legacy,modern]

`mcp-era-proxy stdio --upstream-command "python tests/support/stdio_server.py" --admin-listen
127.0.0.1:0` started as a host starts it, era `auto`, the server waiting `--delay` seconds before it
reads anything (STDIO_SERVER_START_DELAY_S) and writing its pid to a file as it starts
(STDIO_SERVER_STARTS); rows by the server's era (STDIO_SERVER_ERA). A legacy host's `initialize`
is written at once, and `/readyz` on the admin listener is polled every 0.5 s meanwhile, as an
operator's probe would. Measured: from the spawn to the `initialize` answer; the servers started
by then, and by the time `/readyz` answers 200 (or 2 x --delay after the answer, whichever first).

Two revisions side by side as bench/compare.py does (REV checked out in a temporary worktree,
removed at the end); the sides alternate run by run. Output: the table on stdout and
bench/results/slow-start.md. Bounded: each run by 4 x --delay + 60 s; every process it starts is in
its own process group, killed by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import servers
from bench.compare import comparing_parser, imports_from, report_head, rows_of, sides_of
from bench.harness import REPO, begin, machine, say
from tests.support.procs import listening_address

ROWS = ("legacy", "modern")
SERVER = REPO / "tests" / "support" / "stdio_server.py"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "host", "version": "1"}},
}
POLL_S = 0.5


@dataclass
class Run:
    answered_s: float
    started_at_answer: int
    started_in_all: int
    ready_s: float | None  # since the spawn, when /readyz first said 200


def started(starts: Path) -> int:
    return len(starts.read_text().split()) if starts.exists() else 0


async def one_run(tree: Path, era: str, delay: float, work: Path) -> Run:
    starts = work / f"starts-{time.monotonic_ns()}"
    env = {
        **os.environ,
        **servers.tree_env(tree),
        "STDIO_SERVER_ERA": era,
        "STDIO_SERVER_START_DELAY_S": str(delay),
        "STDIO_SERVER_STARTS": str(starts),
    }
    env = {key: value for key, value in env.items() if not key.startswith("MCP_ERA_PROXY_")}
    command = shlex.join([sys.executable, str(SERVER)])
    argv = [sys.executable, "-m", "proxy", "stdio", "--upstream-command", command, "--admin-listen", "127.0.0.1:0"]
    begun = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tree,
        env=env,
        start_new_session=True,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=1 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(4 * delay + 60):
            proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
            await proc.stdin.drain()
            admin = None
            while admin is None:
                line = await proc.stderr.readline()
                if not line:
                    raise RuntimeError("the proxy exited before its admin listener listened")
                admin = listening_address(line, "admin")
            drained = asyncio.create_task(_drain(proc.stderr))
            ready: list[float] = []
            became_ready = asyncio.Event()
            poller = asyncio.create_task(_poll(f"{admin}/readyz", begun, ready, became_ready))
            answer = await proc.stdout.readline()
            answered_s = time.monotonic() - begun
            if b'"result"' not in answer:
                raise RuntimeError(f"initialize answered {answer[:300]!r}")
            at_answer = started(starts)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(became_ready.wait(), 2 * delay)
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 30)
            drained.cancel()
            return Run(answered_s, at_answer, started(starts), ready[0] if ready else None)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(1 << 16):
        pass


async def _poll(url: str, begun: float, ready: list[float], became_ready: asyncio.Event) -> None:
    """/readyz every POLL_S, as an operator's probe; the first 200 is noted."""
    timeout = aiohttp.ClientTimeout(total=POLL_S * 4)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with client.get(url) as response:
                    if response.status == 200 and not ready:
                        ready.append(time.monotonic() - begun)
                        became_ready.set()
            await asyncio.sleep(POLL_S)


def cell(runs: list[Run]) -> str:
    answered = statistics.median(r.answered_s for r in runs)
    at_answer = sorted({r.started_at_answer for r in runs})
    in_all = sorted({r.started_in_all for r in runs})
    readies = [r.ready_s for r in runs if r.ready_s is not None]
    ready = f"{statistics.median(readies):.1f} s" if readies else "not within the wait"
    return (
        f"answered {answered:.1f} s; servers started {'/'.join(map(str, at_answer))} by the answer, "
        f"{'/'.join(map(str, in_all))} in all; /readyz 200 after {ready}"
    )


async def measure(args: argparse.Namespace, work: Path, facts: dict[str, str], started_at: float) -> str:
    load_start = os.getloadavg()
    with ExitStack() as stack:
        sides = sides_of(stack, args.before, args.after)
        for side in sides.values():
            imports_from(side.tree)
        results: dict[tuple[str, str], list[Run]] = {}
        for row in args.rows:
            for number in range(args.runs):
                order = list(sides) if number % 2 == 0 else list(reversed(list(sides)))
                for name in order:
                    run = await one_run(sides[name].tree, row, args.delay, work)
                    say(f"{row} {name} #{number + 1}: {run}")
                    results.setdefault((row, name), []).append(run)
        lines = [
            *report_head("A stdio server slow to start", sides, facts, started_at, (load_start, os.getloadavg())),
            f"Server start-up {args.delay:g} s (STDIO_SERVER_START_DELAY_S), {args.runs} runs each, median.",
            "",
            "| server era | side | first `initialize` answered; servers started; readiness |",
            "|---|---|---|",
        ]
        lines += [
            f"| {row} | {name} ({sides[name].label}) | {cell(results[(row, name)])} |"
            for row in args.rows
            for name in sides
        ]
        return "\n".join(lines) + "\n"


def main() -> int:
    parser: argparse.ArgumentParser = comparing_parser(
        "bench.slow_start", __doc__ or "", "python -m bench.slow_start --before main --delay 8"
    )
    parser.add_argument("--delay", type=float, default=8.0, help="the server's start-up, in seconds (8)")
    parser.add_argument("--runs", type=int, default=2, help="runs per row and side (2)")
    parser.add_argument("--rows", type=rows_of(ROWS), default=list(ROWS), help="some of legacy,modern")
    args = parser.parse_args()
    _, _, started_at, facts = begin(REPO / "bench" / "results", machine)
    with tempfile.TemporaryDirectory() as work:
        table = asyncio.run(measure(args, Path(work), facts, started_at))
    print(table)
    out = REPO / "bench" / "results" / "slow-start.md"
    out.write_text(table)
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
