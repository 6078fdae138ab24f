"""How soon a proxy process answers after it is started, before and after: `mcp-era-proxy stdio` as a
desktop host starts it, and `mcp-era-proxy --upstream URL` as a listener.

    python -m bench.startup --before REV [--after REV|worktree] [--runs 10] [--rows stdio,imports,http,tests]

Two revisions side by side (as bench/compare.py: REV checked out with `git worktree add --detach` in
a temporary directory, removed at the end, and started with this interpreter from there, PYTHONPATH
on it; the other by default this checkout, uncommitted changes included), both byte-compiled first
(`compileall`, as scripts/test.sh does: PYTHONDONTWRITEBYTECODE may be set, and a user's install has
its byte code), in front of the same bench/upstream.py (2026-07-28) on 127.0.0.1. Rows:

- stdio: `python -m proxy stdio --upstream URL` started with stdin/stdout pipes; a legacy host's
  `initialize` is written at once (the proxy reads it when it is ready); from the start of the
  process to its answer line. CPU: the process's CPU clock read when the answer arrives.
- imports: the same run under bench/import_clock.py: CPU and wall time spent importing over the
  whole run (start-up, the initialize, the exit once stdin closes), and the modules loaded.
- http: `python -m proxy --upstream URL --listen 127.0.0.1:0`; its `listening` log line names the
  port; a legacy `initialize` POSTed then; from the start of the process to the answer.
- tests: `pytest -n 0` of `--test-file` (default tests/integration/test_cli.py, a process per test)
  in each tree; wall time, and the CPU of pytest and every process it waited for.

Two controls, the same for both sides: `python -c pass`, and `python -c "import ..."` of the
libraries every start-up needs (LIBRARIES), the floor no change to the proxy's own imports can go
below. One unrecorded warm-up run per row and side, then `--runs` recorded, the sides alternating
before, after, after, before... (the first swaps every round); median (min..max). Output: the table
on stdout, bench/results/startup.md and startup-runs.json. Bounded (`--timeout`); every process it
starts is in its own process group and stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import servers
from bench.compare import Side, comparing_parser, imports_from, report_head, rows_of, sides_of, timed_out
from bench.harness import BENCH, REPO, begin, machine, say
from tests.support.procs import listening_address

SIDES = ("before", "after")
ROWS = ("stdio", "imports", "http", "tests")
CONTROLS = ("python", "libraries")
# What every start-up of the proxy imports, whatever its configuration: the HTTP server and client,
# the settings (pydantic-settings, YAML), logs, metrics, the JSON codec, the event loop, the AEAD of
# its sealed tokens.
LIBRARIES = (
    "aiohttp.web, pydantic_settings, yaml, structlog, prometheus_client, orjson, uvloop, "
    "cryptography.hazmat.primitives.ciphers.aead"
)
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}
WAIT_S = 60.0  # bound on each wait of a run


class RunFailed(Exception):
    """A run that did not get its answer: the row shows this instead of figures."""


@dataclass
class Sample:
    wall_ms: float
    cpu_ms: float
    extra: dict[str, float] = field(default_factory=dict)  # imports: their CPU, wall and the modules
    output: str = ""  # what a command run to its end wrote on stdout


def cpu_clock_s(pid: int) -> float:
    """CPU time (user + system, every thread) of a running process, to the nanosecond: Linux's
    process CPU clock of `pid` (clock_getcpuclockid), where /proc's ticks are 10 ms apart."""
    return time.clock_gettime(((~pid) << 3) | 2)


def stop_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


async def ended(proc: asyncio.subprocess.Process, how: int | None = None) -> None:
    """Wait (bounded) for the process to exit, after `how` (a signal to its group) if given; its
    group is killed if it does not."""
    if how is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, how)
    try:
        await asyncio.wait_for(proc.wait(), WAIT_S / 4)
    except TimeoutError:
        stop_group(proc)
        await proc.wait()


# ---------------------------------------------------------------- one run


def proxy_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", *args]


async def start(argv: list[str], tree: Path, **streams: Any) -> tuple[asyncio.subprocess.Process, int]:
    """The process, in `tree` with that tree's code, and the perf_counter_ns just before it was started."""
    env = {**os.environ, **servers.tree_env(tree)}
    started = time.perf_counter_ns()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=tree, env=env, start_new_session=True, limit=1 << 20, **streams
    )
    return proc, started


async def stdio_run(tree: Path, url: str, log: Path, clock: Path | None = None) -> Sample:
    """One stdio start: spawn, `initialize` at once, its answer; then stdin closed and the exit waited for."""
    args = ("stdio", "--upstream", url)
    argv = proxy_argv(*args)
    if clock is not None:
        argv = [sys.executable, str(BENCH / "import_clock.py"), str(clock), "proxy", *args]
    with log.open("wb") as err:
        proc, started = await start(
            argv, tree, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
        wall_ms = (time.perf_counter_ns() - started) / 1e6
        cpu_ms = cpu_clock_s(proc.pid) * 1000
        if b'"result"' not in line:
            raise RunFailed(f"initialize answered {line[:300]!r}")
        proc.stdin.close()
        await ended(proc)
    except BaseException:
        stop_group(proc)
        await proc.wait()
        raise
    return Sample(wall_ms, cpu_ms)


async def http_run(tree: Path, url: str, log: Path) -> Sample:
    """One listener start: spawn, its `listening` line, a legacy `initialize` POSTed, its answer; then SIGTERM."""
    argv = proxy_argv("--upstream", url, "--listen", "127.0.0.1:0")
    proc, started = await start(argv, tree, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    head: list[bytes] = []  # its log up to the `listening` line; the rest is copied after it
    try:
        address = None
        while address is None:
            line = await asyncio.wait_for(proc.stderr.readline(), WAIT_S)
            head.append(line)
            if not line:
                raise RunFailed("the proxy exited before it listened")
            address = listening_address(line)
        drain = asyncio.create_task(copy_to(proc.stderr, log, head))
        headers = {"Accept": "application/json, text/event-stream"}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as client,
            client.post(address, json=INITIALIZE, headers=headers) as response,
        ):
            body = await response.read()
        wall_ms = (time.perf_counter_ns() - started) / 1e6
        cpu_ms = cpu_clock_s(proc.pid) * 1000
        if response.status != 200 or b'"result"' not in body:
            raise RunFailed(f"initialize answered HTTP {response.status} {body[:300]!r}")
        await ended(proc, signal.SIGTERM)
    except BaseException:
        stop_group(proc)
        await proc.wait()
        raise
    finally:
        if drain is not None:
            await asyncio.wait_for(drain, WAIT_S / 4)
        else:
            with log.open("wb") as out:
                out.write(b"".join(head))
    return Sample(wall_ms, cpu_ms)


async def copy_to(stream: asyncio.StreamReader, log: Path, head: list[bytes]) -> None:
    """`head`, then the rest of the stream, into `log`."""
    with log.open("wb") as out:
        out.write(b"".join(head))
        while chunk := await stream.read(1 << 16):
            out.write(chunk)


def waited(argv: list[str], tree: Path, timeout: float) -> Sample:
    """A command run to its end in `tree`: its wall time, and the CPU of it and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter_ns()
    done = subprocess.run(
        argv,
        cwd=tree,
        env={**os.environ, **servers.tree_env(tree)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=True,
    )
    wall_ms = (time.perf_counter_ns() - started) / 1e6
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RunFailed(f"{' '.join(argv[-3:])} exited {done.returncode}: {(done.stdout + done.stderr)[-400:]}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(wall_ms, cpu_s * 1000, output=done.stdout)


# ---------------------------------------------------------------- rows


@dataclass
class Row:
    key: str
    title: str
    runs: dict[str, list[Sample]] = field(default_factory=lambda: {side: [] for side in SIDES})
    failed: str | None = None


TITLES = {
    "stdio": "`mcp-era-proxy stdio`: spawn → first `initialize` answered",
    "imports": "imports over that stdio run (import_clock)",
    "http": "`mcp-era-proxy --upstream URL`: spawn → first `initialize` answered",
    "tests": "pytest -n 0 {file}",
    "python": "control: `python -c pass`",
    "libraries": "control: the libraries every start-up imports, alone",
}


class Startup:
    def __init__(self, args: argparse.Namespace, sides: dict[str, Side], url: str, logs: Path) -> None:
        self.args = args
        self.sides = sides
        self.url = url
        self.logs = logs
        self.rows = {key: Row(key, TITLES[key].format(file=args.test_file)) for key in (*args.rows, *CONTROLS)}

    def measure(self, key: str, side: str, index: int) -> Sample:
        tree = self.sides[side].tree
        log = self.logs / f"startup-{key}-{side}-{index}.log"
        if key in ("stdio", "imports"):
            clock = self.logs / f"startup-imports-{side}-{index}.json" if key == "imports" else None
            sample = asyncio.run(stdio_run(tree, self.url, log, clock))
            if clock is not None:  # written by bench/import_clock.py as the process exited
                spent = json.loads(clock.read_text())
                sample.extra = {"import_cpu_ms": spent["cpu_s"] * 1000, "import_wall_ms": spent["wall_s"] * 1000}
                sample.extra["modules"] = spent["modules"]
            return sample
        if key == "http":
            return asyncio.run(http_run(tree, self.url, log))
        if key == "tests":
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", self.args.test_file]
            return waited(argv, tree, 600)
        # The CPU clock read as the imports are done and the exit without the interpreter's
        # finalization, as a proxy's CPU is read at its answer: the same span of work.
        imports = "" if key == "python" else f"import {LIBRARIES}; "
        code = f"{imports}import os, time; os.write(1, repr(time.process_time()).encode()); os._exit(0)"
        sample = waited([sys.executable, "-c", code], REPO, 60)
        sample.cpu_ms = float(sample.output) * 1000
        return sample

    def run(self) -> None:
        for key, row in self.rows.items():
            runs = self.args.test_runs if key == "tests" else self.args.runs
            sides = ("after",) if key in CONTROLS else SIDES  # a control is the same code on both sides
            say(f"{row.title}: {runs} runs per side after a warm-up")
            for index in range(runs + 1):
                order = sides if index % 2 == 0 else tuple(reversed(sides))
                for side in order:
                    if row.failed:
                        break
                    try:
                        sample = self.measure(key, side, index)
                    except (RunFailed, TimeoutError, subprocess.TimeoutExpired) as exc:
                        row.failed = f"{side}: {exc or exc.__class__.__name__}"
                        say(f"  {key} {side}: FAILED: {row.failed}")
                        break
                    say(f"  {key} {side} run {index}{' (warm-up)' if not index else ''}: {describe(sample)}")
                    if index:
                        row.runs[side].append(sample)


def describe(sample: Sample) -> str:
    text = f"{sample.wall_ms:.0f} ms wall, {sample.cpu_ms:.0f} ms CPU"
    if sample.extra:
        text += (
            f"; imports {sample.extra['import_cpu_ms']:.0f} ms CPU, {sample.extra['import_wall_ms']:.0f} ms wall, "
            f"{sample.extra['modules']:.0f} modules"
        )
    return text


# ---------------------------------------------------------------- report


def span(values: list[float]) -> str:
    """median (min..max)"""
    if not values:
        return "—"
    return f"{statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"


def ratio(after: list[float], before: list[float]) -> str:
    if not after or not before:
        return "—"
    return f"{statistics.median(after) / statistics.median(before):.2f}"


def figures(row: Row) -> list[tuple[str, Callable[[Sample], float]]]:
    if row.key == "imports":
        return [
            ("import CPU (ms)", lambda s: s.extra["import_cpu_ms"]),
            ("import wall (ms)", lambda s: s.extra["import_wall_ms"]),
            ("modules loaded", lambda s: s.extra["modules"]),
        ]
    return [("wall (ms)", lambda s: s.wall_ms), ("CPU (ms)", lambda s: s.cpu_ms)]


def render(
    startup: Startup, args: argparse.Namespace, facts: dict[str, str], started: float, loads: tuple[Any, Any]
) -> str:
    title = "mcp-era-proxy: time to the first answer, before against after"
    lines = [
        *report_head(title, startup.sides, facts, started, loads),
        f"`python -m bench.startup --before {args.before} --after {args.after} --rows {','.join(args.rows)} "
        f"--runs {args.runs} --test-runs {args.test_runs} --test-file {args.test_file}`: both trees byte-compiled, "
        "in front of the same "
        "bench/upstream.py (2026-07-28); one unrecorded warm-up run per row and side, then the runs, the "
        "sides alternating (the first swaps every round); **median (min..max)**. Wall: from the start of the "
        "process to the answer read. CPU: the process's CPU clock when the answer arrived (tests: pytest and "
        "every process it waited for, once ended). The controls run this interpreter alone, their CPU clock "
        f"read once the imports are done: `python -c pass`, and `import {LIBRARIES}`.",
        "",
        "| row | figure | before | after | after/before |",
        "|---|---|---:|---:|---:|",
    ]
    for row in startup.rows.values():
        if row.failed:
            lines.append(f"| {row.title} | **failed**: {row.failed.replace('|', '/')[:300]} | | | |")
            continue
        for name, value in figures(row):
            before = [value(s) for s in row.runs["before"]]
            after = [value(s) for s in row.runs["after"]]
            if row.key in CONTROLS:
                lines.append(f"| {row.title} | {name} | | {span(after)} | |")
            else:
                lines.append(f"| {row.title} | {name} | {span(before)} | {span(after)} | {ratio(after, before)} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def compiled(tree: Path) -> None:
    """The tree's byte code written (whatever PYTHONDONTWRITEBYTECODE says), as an install has it."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "proxy", "tests"], cwd=tree, capture_output=True, timeout=300
    )


def main() -> int:
    parser = comparing_parser("bench.startup", __doc__, "--before main --runs 10")
    parser.add_argument(
        "--rows", type=rows_of(ROWS), default=list(ROWS), metavar="ROWS", help=f"some of {','.join(ROWS)} (default all)"
    )
    parser.add_argument("--runs", type=int, default=10, metavar="N", help="recorded runs per row and side (10)")
    parser.add_argument("--test-runs", type=int, default=2, metavar="N", help="recorded runs of the tests row (2)")
    parser.add_argument("--test-file", default="tests/integration/test_cli.py", metavar="PATH", help="the tests row's")
    parser.add_argument("--timeout", type=int, default=1800, metavar="S", help="stop after this many seconds (1800)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", metavar="DIR", help="where startup.md goes")
    args = parser.parse_args()
    if args.runs < 1 or args.test_runs < 1:
        parser.error("--runs and --test-runs are at least 1")
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(args.timeout)
    load_start = os.getloadavg()
    logs, procs, started, facts = begin(args.out, machine)
    facts.pop("wrk", None)
    startup: Startup | None = None
    try:
        with ExitStack() as stack:
            sides = sides_of(stack, args.before, args.after)
            for side in sides.values():
                compiled(side.tree)
                say(f"{side.name}: {side.label}; proxy imported from {imports_from(side.tree)}")
            url, _ = stack.enter_context(servers.upstream(procs, "modern"))
            startup = Startup(args, sides, url, logs)
            startup.run()
    except KeyboardInterrupt:
        say("interrupted: every process it started is stopped, the checkout removed")
        return 130
    finally:
        signal.alarm(0)
        procs.stop_all()
    text = render(startup, args, facts, started, (load_start, os.getloadavg()))
    (args.out / "startup.md").write_text(text + "\n")
    runs = {
        key: {side: [{**vars(sample), "output": None} for sample in row.runs[side]] for side in SIDES}
        for key, row in startup.rows.items()
    }
    (args.out / "startup-runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    print(text)
    say(f"done in {time.time() - started:.0f} s: {args.out / 'startup.md'}; logs in {logs}")
    return 0 if not any(row.failed for row in startup.rows.values()) else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
