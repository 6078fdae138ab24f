"""--workers 2 against one worker: the modern pass-through (row (c) of bench/run.py) on one host.

Not a test. Run it through `bash bench/workers.sh [--duration S] [--repeat N]`. Both proxies run
with the same store (a redis-server started here on 127.0.0.1) and secret, so only the number of
processes differs. Load: wrk -t2 -c32 (and -c64), `tools/call` echo to bench/upstream.py. CPU
µs/req counts the supervisor and every worker. Writes bench/results/workers.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from bench import servers
from bench.calls import expect_echo, modern_call
from bench.harness import BENCH, Processes, machine, say
from bench.load import Load, median, median_value, wrk
from bench.report import cpu_text
from tests.support.procs import reserved_port, reserved_ports

SECRET = "bench-workers-secret-0123456789"
SCRIPT = "modern_tools_call.lua"


@contextlib.contextmanager
def redis(procs: Processes) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server is not installed (bash scripts/setup-services.sh)")
    port = reserved_port()  # redis-server cannot be told port 0 (that turns TCP off)
    argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with procs.listening("redis", argv, port=port):
        yield f"redis://127.0.0.1:{port}/0"


@contextlib.contextmanager
def proxy(procs: Processes, upstream: str, store: str, workers: int) -> Iterator[tuple[str, int]]:
    port, admin = reserved_port(), reserved_ports(workers)  # shared by the workers: a known port
    argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--upstream-era", "modern"]
    argv += ["--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}"]
    argv += ["--log-level", "warning", "--workers", str(workers)]
    # No HTTP+SSE clients here (and no internal listener, which serving them with workers needs).
    env = {
        "MCP_ERA_PROXY_STORE__URL": store,
        "MCP_ERA_PROXY_SECURITY__SECRET": SECRET,
        "MCP_ERA_PROXY_DOWNSTREAM__SSE__ENABLED": "false",
    }
    with procs.listening(f"proxy-workers-{workers}", argv, env, port=port) as process:
        deadline = time.monotonic() + 60
        for index in range(workers):  # every worker up, not just the first to bind
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{admin + index}/healthz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"worker {index} did not start") from None
                    time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", process.proc.pid


def measure(args: argparse.Namespace, url: str, pid: int, connections: int) -> tuple[Load, float | None]:
    wrk(url, SCRIPT, connections, 2, args.warmup, {})
    loads = [wrk(url, SCRIPT, connections, 2, args.duration, {}, pid, cpu_tree=True) for _ in range(args.repeat)]
    say(f"  @{connections}: rps {[round(x.rps) for x in loads]} CPU µs/req {[cpu_text(x.cpu_us) for x in loads]}")
    return median(loads), median_value([x.cpu_us for x in loads])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="wrk runs per measurement; the median stands")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up load before each")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    args.profile, args.only = False, set()
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Processes(logs, args.out / ".pids")
    facts = machine()
    rows: list[tuple[int, int, Load, float | None]] = []
    try:
        with redis(procs) as store, servers.upstream(procs, "modern") as (upstream, _):
            for workers in (1, 2):
                say(f"proxy with --workers {workers}")
                with proxy(procs, upstream, store, workers) as (url, pid):
                    expect_echo(f"workers {workers}", *modern_call(url))
                    for connections in (32, 64):
                        load, cpu = measure(args, url, pid, connections)
                        rows.append((workers, connections, load, cpu))
    finally:
        procs.stop_all()
    base = {c: load.rps for w, c, load, _ in rows if w == 1}
    lines = [
        "# --workers 2 against 1 (modern pass-through, tools/call)",
        "",
        "machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()),
        f"wrk -t2, {args.repeat} runs of {args.duration} s each (median), after {args.warmup} s of warm-up; "
        "CPU: the supervisor and every worker",
        "",
        "| workers | connections | rps | vs 1 worker | p50 ms | p99 ms | CPU µs/req | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workers, connections, load, cpu in rows:
        ratio = load.rps / base[connections] if base.get(connections) else 0.0
        lines.append(
            f"| {workers} | {connections} | {load.rps:.0f} | {ratio:.2f}x | {load.p50_ms:.2f} | {load.p99_ms:.2f} "
            f"| {cpu_text(cpu)} | {load.errors} |"
        )
    cores = os.cpu_count() or 1
    if cores < 4:
        lines += [
            "",
            f"Only {cores} cores: wrk, the upstream and every worker share them, so a second worker has no core "
            "of its own here and adds its scheduling cost; the gain needs a host with cores to spare.",
        ]
    text = "\n".join(lines)
    (args.out / "workers.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
