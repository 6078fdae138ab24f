"""Benchmark harness: the proxy against a bare Python hop, direct calls and two peer bridges.

Not a test. Run it through `bash bench/run.sh` (installs wrk, the peers, the venv); by hand:

    .venv/bin/python -m bench.run [--duration 5] [--only a,b,c] [--profile]

Every server runs in its own process group on 127.0.0.1; the load generator is wrk (one Lua
script per request shape, bench/wrk/). Writes bench/results/latest.md and latest.png.
The requests that check a scenario are in bench/calls.py, wrk and the CPU sampling in
bench/load.py, py-spy in bench/profile.py, the servers in bench/servers.py, the report in
bench/report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import servers
from bench.calls import expect_echo, legacy_call, legacy_session, modern_call, modern_list, short
from bench.harness import BENCH, Processes, begin, machine, say
from bench.load import Load, median, median_value, spread, wrk
from bench.profile import finish_profile, start_profile
from bench.report import Row, chart, cpu_text, render
from tests.support import peers

AGAINST_A = {"b", "c", "d", "e", "f", "g"}  # the rows (by first letter) whose added latencies are over (a)


class Bench:
    def __init__(self, args: argparse.Namespace, procs: Processes) -> None:
        self.args = args
        self.procs = procs
        self.rows: list[Row] = []
        self.memory: dict[str, Any] | None = None
        self.streams: dict[str, Any] | None = None  # bench/streams.py's JSON line
        self.profiles: dict[str, list[str]] = {}

    def wanted(self, key: str) -> bool:
        return not self.args.only or key.split("-")[0] in self.args.only or key in self.args.only

    def measure(
        self,
        row: Row,
        url: str,
        script: str,
        env: dict[str, str] | None = None,
        profile_pid: int | None = None,
        cpu_pid: int | None = None,
    ) -> Row:
        """Warm up, then `repeat` runs @1 and @32. `cpu_pid` is the process under test (its CPU time
        per request is recorded per run); `profile_pid`, when profiling, the one py-spy samples."""
        env = env or {}
        duration = self.args.duration
        warm = wrk(url, script, 32, 2, self.args.warmup, env)
        c1: list[Load] = []
        c32: list[Load] = []
        for _ in range(self.args.repeat):  # the run with the median rps stands (this box is noisy)
            c1.append(wrk(url, script, 1, 1, duration, env, cpu_pid))
            c32.append(wrk(url, script, 32, 2, duration, env, cpu_pid))
        row.c1, row.c32 = median(c1), median(c32)
        row.cpu1 = median_value([load.cpu_us for load in c1])  # the median of the runs, not of the rps median
        row.cpu32 = median_value([load.cpu_us for load in c32])
        row.runs = [
            {"c": c, "requests": load.requests, "rps": round(load.rps), "cpu_us": load.cpu_us}
            for c, loads in ((1, c1), (32, c32))
            for load in loads
        ]
        row.total_requests = warm.requests + sum(load.requests for load in c1 + c32)
        errors = warm.errors + sum(load.errors for load in c1 + c32)
        if self.args.repeat > 1:
            row.spread = (spread(c1), spread(c32))
        if self.args.profile and profile_pid is not None:
            # an extra, unrecorded @32 run: sampling must not skew the numbers
            profiler = start_profile(self.args.out, row.key, profile_pid, duration)
            row.total_requests += wrk(url, script, 32, 2, duration, env).requests
            if (summary := finish_profile(row.key, profiler)) is not None:
                self.profiles[row.key] = summary
        if errors:
            row.notes.append(f"**{errors} wrk errors (non-2xx/timeouts)**")
        say(f"  {row.key}: rps over the repeats @1 {[round(x.rps) for x in c1]} @32 {[round(x.rps) for x in c32]}")
        say(f"  {row.key}: requests per run @1 {[x.requests for x in c1]} @32 {[x.requests for x in c32]}")
        if cpu_pid is not None:
            say(
                f"  {row.key}: CPU µs/req per run @1 {[cpu_text(x.cpu_us) for x in c1]} @32 "
                f"{[cpu_text(x.cpu_us) for x in c32]}"
            )
        say(
            f"  {row.key}: rps@1 {row.c1.rps:.0f} p50@1 {row.c1.p50_ms:.3f} ms | "
            f"rps@32 {row.c32.rps:.0f} p50@32 {row.c32.p50_ms:.2f} ms | "
            f"CPU µs/req @1 {cpu_text(row.cpu1)} @32 {cpu_text(row.cpu32)} | errors {errors}"
        )
        self.rows.append(row)
        return row

    # -------------------------------------------------------------- scenarios

    def run(self) -> None:
        cache_known = proxy_knows("cache")
        with servers.upstream(self.procs, "modern") as (modern, upstream_pid):
            if self.wanted("a"):
                say("(a) direct to the modern upstream")
                expect_echo("(a)", *modern_call(modern))
                self.measure(
                    Row("a", "(a) direct → modern upstream (tools/call)"),
                    modern,
                    "modern_tools_call.lua",
                    cpu_pid=upstream_pid,
                )
            if self.wanted("a-list") and not self.args.reference_added:
                say("(a2) direct, tools/list")
                status, reply = modern_list(modern)
                say(f"  check (a2): tools/list -> HTTP {status} {short(reply)}")
                self.measure(
                    Row("a-list", "(a2) direct → modern upstream (tools/list)", ["reference for (f)"], baseline="a"),
                    modern,
                    "modern_tools_list.lua",
                    cpu_pid=upstream_pid,
                )
            if self.wanted("b"):
                say("(b) bare aiohttp hop")
                with servers.bare_hop(self.procs, modern) as (hop, hop_pid):
                    expect_echo("(b)", *modern_call(hop))
                    self.measure(
                        Row("b", "(b) bare aiohttp hop → modern", ["reference Python hop"], baseline="a"),
                        hop,
                        "modern_tools_call.lua",
                        cpu_pid=hop_pid,
                    )
            if self.wanted("c"):
                say("(c) proxy, modern → modern (pass-through)")
                with servers.proxy(self.procs, "c", url=modern, era="modern") as (url, pid):
                    expect_echo("(c)", *modern_call(url))
                    self.measure(
                        Row("c", "(c) proxy modern → modern (pass-through)", ["log level warning"], baseline="a"),
                        url,
                        "modern_tools_call.lua",
                        profile_pid=pid,
                        cpu_pid=pid,
                    )
                say("(c) again with the default info-level access log")
                with servers.proxy(self.procs, "c-info", url=modern, era="modern", level="info") as (url, pid):
                    expect_echo("(c, info)", *modern_call(url))
                    self.measure(
                        Row(
                            "c-info",
                            "(c) same, default info log",
                            ["log level info (one JSON line per request, to a file)"],
                            baseline="a",
                        ),
                        url,
                        "modern_tools_call.lua",
                        profile_pid=pid,
                        cpu_pid=pid,
                    )
            if self.wanted("d"):
                say("(d) proxy, legacy client → modern upstream (translated)")
                with servers.proxy(self.procs, "d", url=modern, era="modern") as (url, pid):
                    session = legacy_session(url)
                    expect_echo("(d)", *legacy_call(url, session))
                    self.measure(
                        Row(
                            "d",
                            "(d) proxy legacy client → modern (translated)",
                            ["log level warning; one session, ids unique per wrk thread"],
                            baseline="a",
                        ),
                        url,
                        "legacy_tools_call.lua",
                        {"BENCH_SESSION": session},
                        profile_pid=pid,
                        cpu_pid=pid,
                    )
            if self.wanted("d-store") or self.wanted("d-store-cached"):
                say("(d-store) the same with the shared session store on a local redis-server")
                with servers.redis(self.procs) as redis_url:
                    env = {"MCP_ERA_PROXY_STORE__URL": redis_url, "MCP_ERA_PROXY_SECURITY__SECRET": "bench-" + "s" * 26}
                    variants = [
                        (
                            "d-store",
                            {},
                            "same, sessions on Redis",
                            "store.url, defaults: the record from this replica's tracked copy (store.tracking)",
                        ),
                        (
                            "d-store-cached",
                            {"MCP_ERA_PROXY_STORE__READ_CACHE_MS": "1000", "MCP_ERA_PROXY_STORE__TRACKING": "false"},
                            "same, untracked, store.read_cache_ms 1000",
                            "a session's state read at most once a second per replica",
                        ),
                    ]
                    for key, extra, title, note in variants:
                        if not self.wanted(key):
                            continue
                        with servers.proxy(self.procs, key, url=modern, era="modern", env={**env, **extra}) as (
                            url,
                            pid,
                        ):
                            session = legacy_session(url)
                            expect_echo(f"({key})", *legacy_call(url, session))
                            self.measure(
                                Row(
                                    key,
                                    f"({key}) {title}",
                                    [note],
                                    baseline="a",
                                ),
                                url,
                                "legacy_tools_call.lua",
                                {"BENCH_SESSION": session},
                                profile_pid=pid,
                                cpu_pid=pid,
                            )
            if self.wanted("f"):
                say("(f) proxy, modern tools/list served from the proxy's cache")
                env = {"MCP_ERA_PROXY_CACHE__ENABLED": "true"} if cache_known else {}
                with servers.proxy(self.procs, "f", url=modern, era="modern", env=env) as (url, pid):
                    before = upstream_count(modern, "tools/list")
                    for request_id in (101, 102):  # warm the cache; the second answer must carry its own id
                        status, reply = modern_list(url, request_id)
                        say(f"  check (f): tools/list id {request_id} -> HTTP {status} {short(reply)}")
                        if (
                            status != 200
                            or not (reply or {}).get("result", {}).get("tools")
                            or reply.get("id") != request_id
                        ):
                            raise RuntimeError(f"(f) tools/list failed: {status} {reply}")
                    row = Row("f", "(f) proxy, cached tools/list", ["log level warning"], baseline="a")
                    if not cache_known:
                        row.notes.append("this proxy build has no `cache` setting yet")
                    self.measure(row, url, "modern_tools_list.lua", profile_pid=pid, cpu_pid=pid)
                    reached = upstream_count(modern, "tools/list") - before
                    sent = row.total_requests + 2
                    row.notes.append(
                        f"upstream saw {reached} of {sent} tools/list ({100 * (1 - reached / sent):.1f}% cached)"
                    )
                    say(f"  (f) upstream saw {reached} of {sent} tools/list")
            if self.wanted("mem"):
                self.measure_memory(modern)
        if self.wanted("e"):
            with servers.upstream(self.procs, "legacy") as (legacy, _):
                say("(e) proxy, modern client → legacy upstream (translated)")
                session = legacy_session(legacy)
                expect_echo("(e, legacy upstream direct)", *legacy_call(legacy, session))
                with servers.proxy(self.procs, "e", url=legacy, era="legacy") as (url, pid):
                    expect_echo("(e)", *modern_call(url))
                    self.measure(
                        Row(
                            "e",
                            "(e) proxy modern client → legacy (translated)",
                            ["log level warning; pooled upstream sessions"],
                            baseline="a",
                        ),
                        url,
                        "modern_tools_call.lua",
                        profile_pid=pid,
                        cpu_pid=pid,
                    )
        if self.wanted("g"):
            self.run_stdio()
        if self.wanted("streams"):
            self.measure_streams()

    def run_stdio(self) -> None:
        env = {"BENCH_TOOL": "echo", "BENCH_ARGS": '{"message":"hi"}'}
        command = shlex.join(["bash", str(peers.peer_sh()), "everything-stdio"])
        say("(g) server-everything over stdio, exposed over HTTP by the proxy")
        with servers.proxy(self.procs, "g", command=command, era="legacy") as (url, pid):
            session = legacy_session(url)
            expect_echo("(g) proxy", *legacy_call(url, session))
            self.measure(
                Row("g", "(g) proxy → server-everything (stdio)", ["log level warning"], baseline="a"),
                url,
                "legacy_tools_call.lua",
                {**env, "BENCH_SESSION": session},
                profile_pid=pid,
                cpu_pid=pid,
            )
        for bridge, label in (
            ("mcp-proxy-everything", "npm mcp-proxy 6.7.19"),
            ("supergateway-everything", "supergateway 4.0.0"),
        ):
            say(f"(g) server-everything over stdio behind {label}")
            with servers.peer(self.procs, bridge) as (url, pid):
                session = legacy_session(url)
                expect_echo(f"(g) {bridge}", *legacy_call(url, session))
                self.measure(
                    Row(
                        f"g-{bridge.split('-')[0]}",
                        f"(g) {label} → server-everything (stdio)",
                        ["peer bridge"],
                        baseline="g",
                    ),
                    url,
                    "legacy_tools_call.lua",
                    {**env, "BENCH_SESSION": session},
                    cpu_pid=pid,
                )

    def measure_memory(self, modern: str) -> None:
        count = self.args.sessions
        say(f"memory: {count} idle legacy sessions in the proxy (modern upstream)")
        env = {"MCP_ERA_PROXY_SESSIONS__MAX_SESSIONS": str(max(20_000, 2 * count))}
        with servers.proxy(self.procs, "mem", url=modern, era="modern", env=env) as (url, pid):
            done = subprocess.run(
                [sys.executable, "-m", "bench.sessions_rss", "--url", url, "--pid", str(pid), "--count", str(count)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"sessions_rss failed: {done.stderr[-1000:]}")
            self.memory = json.loads(done.stdout.strip().splitlines()[-1])
            say(f"  memory: {self.memory}")

    def measure_streams(self) -> None:
        """bench/streams.py in a process of its own (it starts and stops its upstream and proxy):
        `--streams` legacy sessions of one caller, each holding a GET stream. Bounded: past its own
        time limit it is sent SIGTERM (it stops what it started), then killed."""
        count, limit = self.args.streams, 300
        say(f"streams: {count} legacy sessions of one caller, each holding a GET stream (bench.streams)")
        argv = [sys.executable, "-m", "bench.streams", "--sessions", str(count), "--time-limit", str(limit)]
        with (self.procs.logs / "streams.log").open("w") as log:
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
            try:
                out, _ = child.communicate(timeout=limit + 60)
            finally:
                if child.poll() is None:  # timed out, or this harness is stopping
                    child.terminate()
                    try:
                        child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
        if child.returncode != 0:
            raise RuntimeError(f"bench.streams failed ({child.returncode}): see {self.procs.logs / 'streams.log'}")
        self.streams = json.loads(out.strip().splitlines()[-1])
        say(f"  streams: {self.streams}")


def proxy_knows(section: str) -> bool:
    """Whether this proxy build has a settings section (the response cache may not be there yet)."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "--upstream", "http://127.0.0.1:9/mcp", "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        return section in json.loads(done.stdout)
    except ValueError:
        return False


def upstream_count(url: str, method: str) -> int:
    stats_url = url.rsplit("/", 1)[0] + "/stats"
    with urllib.request.urlopen(stats_url, timeout=10) as response:
        return int(json.loads(response.read()).get(method, 0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="wrk runs per measurement; the median stands")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up load before each scenario")
    parser.add_argument("--sessions", type=int, default=10_000, help="idle legacy sessions for the memory line")
    parser.add_argument(
        "--streams", type=int, default=1000, help="legacy sessions each holding a GET stream for the streams line"
    )
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(), help="e.g. a,b,c,mem,streams")
    parser.add_argument("--quick", action="store_true", help="same as --only b,c,d,e: the CPU/req targets")
    parser.add_argument("--profile", action="store_true", help="py-spy the proxy during its @32 runs")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    if args.quick:
        args.only = args.only or {"b", "c", "d", "e"}
    # the rows' added latencies are over (a): it runs whenever one of them does (without (a2))
    args.reference_added = (
        bool(args.only) and "a" not in args.only and any(k.split("-")[0] in AGAINST_A for k in args.only)
    )
    if args.reference_added:
        args.only.add("a")
    load_start = os.getloadavg()
    logs, procs, started, facts = begin(args.out, machine)
    bench = Bench(args, procs)
    try:
        bench.run()
    finally:
        procs.stop_all()
    order = [
        "a",
        "a-list",
        "b",
        "c",
        "c-info",
        "d",
        "d-store",
        "d-store-cached",
        "e",
        "f",
        "g",
        "g-mcp",
        "g-supergateway",
    ]
    bench.rows.sort(key=lambda row: order.index(row.key) if row.key in order else len(order))
    loads = (load_start, os.getloadavg())
    text, _ = render(bench.rows, bench.memory, bench.profiles, args, facts, started, bench.streams, loads)
    (args.out / "latest.md").write_text(text + "\n")
    runs: dict[str, Any] = {
        row.key: {"cpu_us@1": row.cpu1, "cpu_us@32": row.cpu32, "runs": row.runs} for row in bench.rows
    }
    if bench.streams is not None:
        runs["streams"] = bench.streams
    (args.out / "latest-runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    try:
        chart(bench.rows, args.out / "latest.png")
    except ImportError:
        say("matplotlib missing: no chart (install the `bench` extra)")
    print(text)
    say(f"done in {time.time() - started:.0f} s: {args.out / 'latest.md'}, {args.out / 'latest.png'}; logs in {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
