"""What one `tools/call` costs the process under test in work the machine's load cannot move:
Python bytecodes executed, and (with --callgrind) CPU instructions in user space.

    python -m bench.instructions [--rows b,c,d,e] [--before REV] [--callgrind] [--requests 400]

Rows as in bench/run.py: (b) the bare aiohttp hop, (c) pass-through, (d) a legacy client in front of
a modern upstream, (e) a modern client in front of a legacy upstream, each in front of the bench
upstream on 127.0.0.1. For each row the process is started under bench/opcount.py (and, with
--callgrind, again under valgrind's callgrind with instrumentation off), warmed up, then counted over
exactly `--requests` calls at 8 in flight. With `--before REV`, REV's proxy (a detached worktree,
removed at the end) is counted the same way beside this checkout's.

Why: on a shared 2-core machine CPU µs per request moves by ±5-10 % between runs, so a change of a
few per cent cannot be seen in time (bench/compare.py). The same requests through the same code
execute the same bytecodes and instructions to within a fraction of a per cent, so these counts
compare two revisions exactly and say which layer a request's work is in. They do not replace the
time measurements: system calls and the kernel's share are not in them, and an instruction is not a
fixed time. Output: a table on stdout and bench/results/instructions.md; every process is stopped by
its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import glob
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from bench import servers
from bench.calls import CAPS_KEY, LEGACY, MODERN, VERSION_KEY, legacy_session, modern_headers
from bench.compare import checked_out, this_checkout
from bench.harness import BENCH, REPO, Processes, begin, machine, say

ROWS = {"b": "modern", "c": "modern", "d": "modern", "d-store": "modern", "e": "legacy"}
TITLES = {
    "b": "(b) bare aiohttp hop → modern",
    "c": "(c) proxy modern → modern (pass-through)",
    "d": "(d) proxy legacy client → modern",
    "d-store": "(d-store) the same, sessions on Redis (tracked copies, the default)",
    "e": "(e) proxy modern client → legacy",
}
IN_FLIGHT = 8
STORE_SECRET = "bench-instructions-" + "s" * 24
WARMUP = 200
ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def package(key: str) -> str:
    """The layer a counted function belongs to: proxy/<subpackage>, a library, or the stdlib."""
    where = key.split(" <- ")[-1] if key.startswith("<string>") else key
    path = where.split(":")[0]
    if path.startswith("proxy/"):
        parts = path.split("/")
        return "proxy/" + parts[1] if len(parts) > 2 else "proxy (root)"
    if path.startswith("/") or path.startswith("<frozen"):
        return "stdlib"
    return path.split("/")[0].removesuffix(".py")


def request_for(row: str, url: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The headers and body of the row's tools/call (for (d), in a fresh legacy session)."""
    if row in ("d", "d-store"):
        headers = {"Mcp-Session-Id": legacy_session(url), "MCP-Protocol-Version": LEGACY, **ACCEPT}
        return headers, {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    params = {"name": "echo", "arguments": {}, "_meta": {VERSION_KEY: MODERN, CAPS_KEY: {}}}
    return {**modern_headers("tools/call", "echo"), **ACCEPT}, {
        "jsonrpc": "2.0",
        "method": "tools/call",
        "params": params,
    }


async def drive(url: str, headers: dict[str, str], body: dict[str, Any], count: int) -> None:
    """`count` calls at IN_FLIGHT in flight, each checked (HTTP 200, a result)."""
    ids = itertools.count(1)
    per_worker = count // IN_FLIGHT
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def worker() -> None:
            for _ in range(per_worker):
                message = {**body, "id": next(ids)}
                message["params"] = {**body["params"], "arguments": {"message": "hi"}}
                async with client.post(url, data=json.dumps(message), headers=headers) as response:
                    text = await response.text()
                    if response.status != 200 or '"result"' not in text:
                        raise RuntimeError(f"{url}: HTTP {response.status} {text[:200]}")

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))


def counted(url: str, row: str, requests: int, start: Any, stop: Any) -> None:
    headers, body = request_for(row, url)
    asyncio.run(drive(url, headers, body, WARMUP))
    start()
    asyncio.run(drive(url, headers, body, requests))
    stop()


def wait_for(path: Path, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} was not written within {within_s} s")
        time.sleep(0.1)


@contextlib.contextmanager
def serving(
    procs: Processes,
    row: str,
    upstream: str,
    tree: Path | None,
    launcher: list[str],
    name: str,
    env: dict[str, str] | None,
) -> Iterator[tuple[str, int]]:
    """The row's process (`env`: the proxy's settings beyond the defaults), once it listens."""
    if row == "b":
        with servers.bare_hop(procs, upstream, name, launcher=launcher, timeout=180) as served:
            yield served
    else:
        with servers.proxy(
            procs, name, url=upstream, era=ROWS[row], tree=tree, launcher=launcher, timeout=180, env=env
        ) as served:
            yield served


def bytecodes(
    procs: Processes, row: str, upstream: str, tree: Path | None, requests: int, work: Path, env: dict[str, str] | None
) -> dict[str, float]:
    """Bytecodes per request by function (bench/opcount.py)."""
    out = work / f"opcount-{row}-{os.getpid()}-{time.monotonic_ns()}.json"
    launcher = [sys.executable, "-m", "bench.opcount", str(out)]
    if tree is not None:  # the module runs from that tree; bench.opcount from this checkout
        launcher = [sys.executable, str(REPO / "bench" / "opcount.py"), str(out)]
    with serving(procs, row, upstream, tree, launcher, f"opcount-{row}", env) as (url, pid):
        counted(url, row, requests, lambda: os.kill(pid, signal.SIGUSR1), lambda: os.kill(pid, signal.SIGUSR2))
        wait_for(out, 60)
    counts: dict[str, int] = json.loads(out.read_text())
    return {key: value / requests for key, value in counts.items()}


def instructions(
    procs: Processes, row: str, upstream: str, tree: Path | None, requests: int, work: Path, env: dict[str, str] | None
) -> float:
    """User-space instructions per request under callgrind (collection on only while counting)."""
    prefix = work / f"callgrind-{row}-{time.monotonic_ns()}"
    launcher = ["valgrind", "--tool=callgrind", "-q", "--instr-atstart=no", f"--callgrind-out-file={prefix}.%p"]
    launcher += [sys.executable, "-m"]

    def control(pid: int, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=60)

    with serving(procs, row, upstream, tree, launcher, f"callgrind-{row}", env) as (url, pid):
        counted(url, row, requests, lambda: control(pid, "-i", "on"), lambda: control(pid, "-d"))
    for dump in glob.glob(f"{prefix}.*.1"):  # the dump made when counting stopped
        for line in Path(dump).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1]) / requests
    raise RuntimeError(f"callgrind wrote no dump for {row}")


def render(
    results: dict[str, dict[str, Any]], sides: list[str], args: argparse.Namespace, labels: dict[str, str]
) -> str:
    lines = ["# Work per request (bench/instructions.py)", ""]
    lines.append(
        f"`python -m bench.instructions` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{args.requests} tools/call per row at {IN_FLIGHT} in flight after {WARMUP} unrecorded; "
        "counts of the process under test. " + "; ".join(f"**{s}**: {labels[s]}" for s in sides)
    )
    lines.append("")
    head = "| row | " + " | ".join(f"bytecodes/req {s}" for s in sides)
    head += " | " + " | ".join(f"proxy's own {s}" for s in sides)
    if args.callgrind:
        head += " | " + " | ".join(f"instructions/req {s}" for s in sides)
    if len(sides) == 2:
        head += " | bytecodes after/before" + (" | instructions after/before" if args.callgrind else "")
    lines += [head + " |", "|" + "---|" * (head.count("|"))]
    b = results.get(f"b/{sides[-1]}")
    for row in args.rows:
        cells = [TITLES[row]]
        per_side = [results.get(f"{row}/{s}") for s in sides]
        cells += [f"{sum(r['bytecodes'].values()):,.0f}" if r else "—" for r in per_side]
        cells += [f"{r['own']:,.0f}" if r else "—" for r in per_side]
        if args.callgrind:
            cells += [f"{r['instructions']:,.0f}" if r and "instructions" in r else "—" for r in per_side]
        if len(sides) == 2:
            before, after = per_side
            if before is not None and after is not None:
                cells.append(f"{sum(after['bytecodes'].values()) / sum(before['bytecodes'].values()):.3f}")
                if args.callgrind:
                    cells.append(f"{after['instructions'] / before['instructions']:.3f}")
            else:
                cells += ["—"] * (2 if args.callgrind else 1)
        lines.append("| " + " | ".join(cells) + " |")
    if b is not None:
        lines += ["", "Over the bare hop (b), this checkout:"]
        for row in args.rows:
            r = results.get(f"{row}/{sides[-1]}")
            if row == "b" or r is None:
                continue
            text = f"- ({row}) bytecodes {sum(r['bytecodes'].values()) / sum(b['bytecodes'].values()):.2f}x"
            if args.callgrind:
                text += f", instructions {r['instructions'] / b['instructions']:.2f}x"
            lines.append(text)
    lines += ["", "## By layer (bytecodes per request)", ""]
    for key, r in results.items():
        layers: collections.Counter[str] = collections.Counter()
        for name, value in r["bytecodes"].items():
            layers[package(name)] += value
        lines.append(f"- **{key}**: " + ", ".join(f"{name} {value:,.0f}" for name, value in layers.most_common(12)))
    lines += ["", f"## Top {args.top} functions (bytecodes per request)", ""]
    for key, r in results.items():
        lines += [f"**{key}**", "```"]
        top = sorted(r["bytecodes"].items(), key=lambda kv: -kv[1])[: args.top]
        lines += [f"{value:8.1f}  {name}" for name, value in top]
        lines += ["```", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows",
        type=lambda s: s.split(","),
        default=["b", "c", "d", "e"],
        help="some of b,c,d,d-store,e (default b,c,d,e)",
    )
    parser.add_argument("--before", metavar="REV", help="also count REV's proxy (a temporary worktree)")
    parser.add_argument("--requests", type=int, default=400, help="counted calls per row (default 400)")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions (valgrind)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per row (default 25)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    if unknown := set(args.rows) - set(ROWS):
        parser.error(f"unknown rows {sorted(unknown)}")
    if args.requests < IN_FLIGHT or args.requests % IN_FLIGHT:
        parser.error(f"--requests is a multiple of {IN_FLIGHT}")
    if args.callgrind and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        parser.error("--callgrind needs valgrind (apt-get install valgrind)")
    _, procs, _, _ = begin(args.out, machine)
    results: dict[str, dict[str, Any]] = {}
    labels: dict[str, str] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        with ExitStack() as stack:
            trees: dict[str, Path | None] = {}
            if args.before:
                before_tree, labels["before"] = stack.enter_context(checked_out(args.before))
                trees["before"] = before_tree
            trees["after" if args.before else "this"] = None
            labels["after" if args.before else "this"] = this_checkout()
            envs: dict[str, dict[str, str]] = {}  # a row's proxy settings beyond the defaults
            if "d-store" in args.rows:
                store = stack.enter_context(servers.redis(procs))
                envs["d-store"] = {"MCP_ERA_PROXY_STORE__URL": store, "MCP_ERA_PROXY_SECURITY__SECRET": STORE_SECRET}
            for row in args.rows:
                with servers.upstream(procs, ROWS[row]) as (upstream, _):
                    for side, tree in trees.items():
                        if row == "b" and side == "before":
                            continue  # the hop is not the proxy's code: counted once
                        say(f"{row}/{side}: counting bytecodes")
                        counts = bytecodes(procs, row, upstream, tree, args.requests, work, envs.get(row))
                        own = sum(v for k, v in counts.items() if package(k).startswith("proxy"))
                        result: dict[str, Any] = {"bytecodes": counts, "own": own}
                        if args.callgrind:
                            say(f"{row}/{side}: counting instructions (callgrind)")
                            result["instructions"] = instructions(
                                procs, row, upstream, tree, args.requests, work, envs.get(row)
                            )
                        results[f"{row}/{side}"] = result
                        say(f"  {sum(counts.values()):,.0f} bytecodes/req, the proxy's own {own:,.0f}")
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    sides = list(labels)
    text = render(results, sides, args, labels)
    (args.out / "instructions.md").write_text(text)
    print(text.split("## By layer")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
