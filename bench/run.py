"""Benchmark harness: the proxy against a bare Python hop, direct calls and two peer bridges.

Not a test. Run it through `bash bench/run.sh` (installs wrk, the peers, the venv); by hand:

    .venv/bin/python -m bench.run [--duration 5] [--only a,b,c] [--profile]

Every server runs in its own process group on 127.0.0.1; the load generator is wrk (one Lua
script per request shape, bench/wrk/). Writes bench/results/latest.md and latest.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import BENCH, Processes, begin, machine, say
from tests.support import peers
from tests.support.procs import reserved_port

WRK_DIR = BENCH / "wrk"
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"


# ---------------------------------------------------------------- one-off requests (checks)


def post(url: str, message: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    """POST one JSON-RPC message; (status, headers, the reply message or None). JSON or SSE."""
    request = urllib.request.Request(
        url,
        data=json.dumps(message).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Accept": ACCEPT, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, reply_headers, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, reply_headers, body = exc.code, exc.headers, exc.read()
    text = body.decode(errors="replace")
    if "text/event-stream" in (reply_headers.get("Content-Type") or ""):
        messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        finals = [m for m in messages if "result" in m or "error" in m]
        return status, reply_headers, finals[-1] if finals else None
    return status, reply_headers, json.loads(text) if text.strip() else None


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def modern_call(url: str, tool: str = "echo", arguments: dict[str, Any] | None = None) -> tuple[int, Any]:
    params = {"name": tool, "arguments": arguments or {"message": "hi"}, "_meta": {VERSION_KEY: MODERN, CAPS_KEY: {}}}
    status, _, reply = post(
        url, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}, modern_headers("tools/call", tool)
    )
    return status, reply


def modern_list(url: str, request_id: int = 1) -> tuple[int, Any]:
    params = {"_meta": {VERSION_KEY: MODERN, CAPS_KEY: {}}}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}
    status, _, reply = post(url, message, modern_headers("tools/list"))
    return status, reply


def legacy_session(url: str) -> str:
    """initialize, then notifications/initialized; the session id."""
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1.0.0"}}
    status, headers, reply = post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
    session = headers.get("Mcp-Session-Id")
    if status != 200 or not session or not isinstance(reply, dict) or "result" not in reply:
        raise RuntimeError(f"initialize at {url} failed: HTTP {status} {reply}")
    say(f"  initialize -> HTTP {status}, session {session[:12]}..., {short(reply)}")
    status, _, _ = post(
        url,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY},
    )
    if status not in (200, 202):
        raise RuntimeError(f"notifications/initialized at {url}: HTTP {status}")
    return session


def legacy_call(url: str, session: str, tool: str = "echo", arguments: dict[str, Any] | None = None) -> tuple[int, Any]:
    params = {"name": tool, "arguments": arguments or {"message": "hi"}}
    status, _, reply = post(
        url,
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
        {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY},
    )
    return status, reply


def short(value: Any, limit: int = 220) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit] + "..."


def expect_echo(label: str, status: int, reply: Any) -> None:
    """The echo reply must carry the text 'hi' (server-everything says 'Echo: hi')."""
    say(f"  check {label}: tools/call -> HTTP {status} {short(reply)}")
    content = (reply or {}).get("result", {}).get("content") if isinstance(reply, dict) else None
    text = content[0].get("text", "") if isinstance(content, list) and content else ""
    if status != 200 or "hi" not in text or reply.get("id") != 1:
        raise RuntimeError(f"{label} did not answer the echo correctly: HTTP {status} {reply}")


# ---------------------------------------------------------------- CPU time of the process under test

CLK_TCK = os.sysconf("SC_CLK_TCK")
WRAPPERS = frozenset({"bash", "sh", "dash", "env", "timeout"})  # a pid that is not the server itself


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, utime + stime in clock ticks) from /proc/<pid>/stat; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cpu_ticks(pid: int, tree: bool = False) -> int:
    """utime + stime of the process under test, in clock ticks (os.sysconf('SC_CLK_TCK') a second).

    The process itself only (the proxy, the bare hop and the upstreams are the python process
    started; peer.sh execs node), not its children: for the stdio rows those are the upstream.
    Only if `pid` is a wrapper (a shell that did not exec), or `tree` asks for them (a supervisor
    and its workers, bench/workers.py), are its live descendants added.
    """
    stat = _stat(pid)
    if stat is None:
        return 0
    ticks = stat[2]
    if tree or stat[0] in WRAPPERS:
        ticks += sum(s[2] for child in _descendants(pid) if (s := _stat(child)) is not None)
    return ticks


def cpu_us_per_request(ticks: int, requests: int) -> float | None:
    return ticks * 1e6 / CLK_TCK / requests if requests else None


def median_value(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


# ---------------------------------------------------------------- wrk


@dataclass
class Load:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int  # completed in this wrk run
    errors: int
    cpu_us: float | None = None  # CPU time of the process under test per completed request


@dataclass
class Row:
    key: str
    label: str
    notes: list[str] = field(default_factory=list)
    c1: Load | None = None
    c32: Load | None = None
    baseline: str | None = None  # the row "added p50@1" is measured against
    total_requests: int = 0
    spread: tuple[str, str] | None = None  # rps range over the repeats, @1 and @32
    cpu1: float | None = None  # CPU µs per request of the process under test, median of the runs @1
    cpu32: float | None = None  # the same @32
    runs: list[dict[str, Any]] = field(default_factory=list)  # every recorded wrk run: requests, rps, CPU


def median(loads: list[Load]) -> Load:
    return sorted(loads, key=lambda load: load.rps)[len(loads) // 2]


def spread(loads: list[Load]) -> str:
    values = sorted(load.rps for load in loads)
    return f"{values[0]:.0f}..{values[-1]:.0f}"


def wrk(
    url: str,
    script: str,
    connections: int,
    threads: int,
    duration: int,
    env: dict[str, str],
    cpu_pid: int | None = None,
    cpu_tree: bool = False,
) -> Load:
    """One wrk run; with `cpu_pid`, that process's CPU time (with `cpu_tree`, its descendants' too)
    is sampled right before and after it."""
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration}s",
        "--timeout",
        "10s",
        "-s",
        str(WRK_DIR / script),
        url,
    ]
    before = cpu_ticks(cpu_pid, cpu_tree) if cpu_pid is not None else 0
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=duration + 30, check=False
    )
    ticks = cpu_ticks(cpu_pid, cpu_tree) - before if cpu_pid is not None else None
    match = re.search(r"^BENCH_JSON (.*)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    data = json.loads(match[1])
    errors = sum(v for k, v in data.items() if k.startswith("errors_"))
    return Load(
        rps=data["requests"] / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        requests=data["requests"],
        errors=errors,
        cpu_us=cpu_us_per_request(ticks, data["requests"]) if ticks is not None else None,
    )


class Bench:
    def __init__(self, args: argparse.Namespace, procs: Processes) -> None:
        self.args = args
        self.procs = procs
        self.rows: list[Row] = []
        self.memory: dict[str, Any] | None = None
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
        profiler = self._start_profile(row.key, profile_pid, duration)
        if profiler is not None:  # an extra, unrecorded @32 run: sampling must not skew the numbers
            row.total_requests += wrk(url, script, 32, 2, duration, env).requests
            self._finish_profile(row.key, profiler)
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

    # -------------------------------------------------------------- profiling (optional)

    def _start_profile(self, key: str, pid: int | None, duration: float) -> tuple[subprocess.Popen[bytes], Path] | None:
        if not self.args.profile or pid is None:
            return None
        out = self.args.out / f"profile-{key}.txt"
        argv = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(duration)), "--rate", "250"]
        argv += ["--format", "raw", "--output", str(out), "--nonblocking"]
        py_spy = Path(sys.executable).with_name("py-spy")
        if py_spy.exists():
            argv[0] = str(py_spy)
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        return proc, out

    def _finish_profile(self, key: str, profiler: tuple[subprocess.Popen[bytes], Path]) -> None:
        proc, out = profiler
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        if not out.exists():
            say(f"  py-spy gave no profile for {key}: {err.decode(errors='replace')[-300:]}")
            return
        self.profiles[key] = summarize_profile(out)
        say(f"  profile {key} (self time, top frames):\n    " + "\n    ".join(self.profiles[key]))

    # -------------------------------------------------------------- servers

    @contextlib.contextmanager
    def upstream(self, era: str) -> Iterator[tuple[str, int]]:
        argv = [sys.executable, "-m", "bench.upstream", "--port", "0", "--era", era]
        with self.procs.listening(f"upstream-{era}", argv) as process:
            yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid

    @contextlib.contextmanager
    def proxy(
        self,
        name: str,
        *,
        url: str | None = None,
        command: str | None = None,
        era: str,
        level: str = "warning",
        env: dict[str, str] | None = None,
    ) -> Iterator[tuple[str, int]]:
        target = ["--upstream", url] if url else ["--upstream-command", str(command)]
        argv = [sys.executable, "-m", "proxy", *target, "--upstream-era", era, "--listen", "127.0.0.1:0"]
        argv += ["--log-level", level]  # its one listener is found without its `listening` line
        with self.procs.listening(f"proxy-{name}", argv, env) as process:
            yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid

    @contextlib.contextmanager
    def redis(self) -> Iterator[str]:
        """A redis-server of our own on loopback, without persistence (installed like wrk)."""
        if shutil.which("redis-server") is None:
            say("[bench] installing redis-server")
            subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], check=True, capture_output=True)
        port = reserved_port()  # redis-server cannot be told port 0 (that turns TCP off)
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with self.procs.listening("redis", argv, port=port):
            yield f"redis://127.0.0.1:{port}/0"

    @contextlib.contextmanager
    def bare_hop(self, upstream: str) -> Iterator[tuple[str, int]]:
        argv = [sys.executable, "-m", "bench.bare_hop", "--upstream", upstream, "--port", "0"]
        with self.procs.listening("bare-hop", argv) as process:
            yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid

    @contextlib.contextmanager
    def peer(self, name: str) -> Iterator[tuple[str, int]]:
        """A peer bridge; peer.sh execs node, so the pid is the bridge (cpu_ticks checks anyway)."""
        with self.procs.listening(name, ["bash", str(peers.peer_sh()), name, "0"]) as process:
            yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid

    # -------------------------------------------------------------- scenarios

    def run(self) -> None:
        cache_known = proxy_knows("cache")
        with self.upstream("modern") as (modern, upstream_pid):
            if self.wanted("a"):
                say("(a) direct to the modern upstream")
                expect_echo("(a)", *modern_call(modern))
                self.measure(
                    Row("a", "(a) direct → modern upstream (tools/call)"),
                    modern,
                    "modern_tools_call.lua",
                    cpu_pid=upstream_pid,
                )
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
                with self.bare_hop(modern) as (hop, hop_pid):
                    expect_echo("(b)", *modern_call(hop))
                    self.measure(
                        Row("b", "(b) bare aiohttp hop → modern", ["reference Python hop"], baseline="a"),
                        hop,
                        "modern_tools_call.lua",
                        cpu_pid=hop_pid,
                    )
            if self.wanted("c"):
                say("(c) proxy, modern → modern (pass-through)")
                with self.proxy("c", url=modern, era="modern") as (url, pid):
                    expect_echo("(c)", *modern_call(url))
                    self.measure(
                        Row("c", "(c) proxy modern → modern (pass-through)", ["log level warning"], baseline="a"),
                        url,
                        "modern_tools_call.lua",
                        profile_pid=pid,
                        cpu_pid=pid,
                    )
                say("(c) again with the default info-level access log")
                with self.proxy("c-info", url=modern, era="modern", level="info") as (url, pid):
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
                with self.proxy("d", url=modern, era="modern") as (url, pid):
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
                with self.redis() as redis_url:
                    env = {"MCP_ERA_PROXY_STORE__URL": redis_url, "MCP_ERA_PROXY_SECURITY__SECRET": "bench-" + "s" * 26}
                    variants = [
                        ("d-store", {}, "same, sessions on Redis", "store.url: one Redis round trip per request"),
                        (
                            "d-store-cached",
                            {"MCP_ERA_PROXY_STORE__READ_CACHE_MS": "1000"},
                            "same, store.read_cache_ms 1000",
                            "a session's state read at most once a second per replica",
                        ),
                    ]
                    for key, extra, title, note in variants:
                        if not self.wanted(key):
                            continue
                        with self.proxy(key, url=modern, era="modern", env={**env, **extra}) as (url, pid):
                            session = legacy_session(url)
                            expect_echo(f"({key})", *legacy_call(url, session))
                            self.measure(
                                Row(
                                    key,
                                    f"({key}) {title}",
                                    [note],
                                    baseline="d",
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
                with self.proxy("f", url=modern, era="modern", env=env) as (url, pid):
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
            with self.upstream("legacy") as (legacy, _):
                say("(e) proxy, modern client → legacy upstream (translated)")
                session = legacy_session(legacy)
                expect_echo("(e, legacy upstream direct)", *legacy_call(legacy, session))
                with self.proxy("e", url=legacy, era="legacy") as (url, pid):
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

    def run_stdio(self) -> None:
        env = {"BENCH_TOOL": "echo", "BENCH_ARGS": '{"message":"hi"}'}
        command = shlex.join(["bash", str(peers.peer_sh()), "everything-stdio"])
        say("(g) server-everything over stdio, exposed over HTTP by the proxy")
        with self.proxy("g", command=command, era="legacy") as (url, pid):
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
            with self.peer(bridge) as (url, pid):
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
        with self.proxy("mem", url=modern, era="modern", env=env) as (url, pid):
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


_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.*?)(?::\d+)?\)$")
_BUCKETS = (
    ("aiohttp", "aiohttp/"),
    ("proxy", "proxy/"),
    ("asyncio", "asyncio/"),
    ("prometheus_client", "prometheus_client/"),
    ("structlog", "structlog/"),
    ("pydantic", "pydantic"),
    ("multidict/yarl", "multidict/"),
    ("multidict/yarl", "yarl/"),
)


def _frame(raw: str) -> tuple[str, str]:
    """'func (path/file.py:123)' -> ('func (path/file.py)', 'path/file.py')."""
    match = _FRAME.match(raw)
    if match is None:
        return raw or "(native)", ""
    return f"{match['name']} ({match['file']})", match["file"]


def _bucket(name: str, file: str) -> str:
    if name.startswith(("Runner.run", "run (uvloop")) or not file:
        return "event loop + syscalls (uvloop, C)"
    for label, marker in _BUCKETS:
        if marker in file:
            return label
    return "other Python"


def summarize_profile(path: Path, top: int = 10) -> list[str]:
    """py-spy raw (collapsed) stacks: self time by package, top functions by self time, and the
    proxy's own functions by inclusive time (coroutine stacks as py-spy sees them)."""
    by_bucket: dict[str, int] = {}
    self_time: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [_frame(f) for f in stack.split(";")]
        leaf, leaf_file = frames[-1]
        self_time[leaf] = self_time.get(leaf, 0) + samples
        bucket = _bucket(leaf, leaf_file)
        by_bucket[bucket] = by_bucket.get(bucket, 0) + samples
        for name in {name for name, file in frames if file.startswith("proxy/")}:
            inclusive[name] = inclusive.get(name, 0) + samples
    if not total:
        return ["(no samples)"]

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    out = [
        "self time by package: "
        + ", ".join(f"{k} {pct(v).strip()}" for k, v in sorted(by_bucket.items(), key=lambda kv: -kv[1]))
    ]
    out += [f"self {pct(n)}  {f}" for f, n in sorted(self_time.items(), key=lambda kv: -kv[1])[:top]]
    out += [f"incl {pct(n)}  {f}" for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]]
    return out


# ---------------------------------------------------------------- report


def ms(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def cpu_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def render(bench: Bench, args: argparse.Namespace, facts: dict[str, str], started: float) -> tuple[str, list[str]]:
    rows = {row.key: row for row in bench.rows}
    lines = ["# mcp-era-proxy benchmark", ""]
    lines.append(" · ".join(f"**{k}**: {v}" for k, v in facts.items()))
    lines.append("")
    lines.append(
        f"`bash bench/run.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}; wrk, "
        f"{args.repeat} runs of {args.duration} s per measurement (the run with the median rps is shown; "
        f"rps range in the notes) after a {args.warmup} s warm-up at 32 connections; "
        "@1 = `wrk -t1 -c1`, @32 = `wrk -t2 -c32`; latency in ms. Proxy runs at log level **warning** "
        "unless the row says otherwise. Load generator, proxy, upstream (and bridges) share the "
        f"{facts['cores']} cores above, all on 127.0.0.1. CPU µs/req = utime + stime of the process "
        "under test (the server wrk talks to; for (a) the upstream), sampled from /proc right before "
        "and after each run, over the requests wrk completed in it; median of the runs. Steadier than "
        "rps on a shared machine."
    )
    lines.append("")
    lines.append(
        "| scenario | rps@1 | p50@1 (ms) | p99@1 | rps@32 | p50@32 | p99@32 | CPU µs/req@1 | CPU µs/req@32 "
        "| added p50@1 (ms) | notes |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in bench.rows:
        assert row.c1 is not None and row.c32 is not None
        added = "—"
        base = rows.get(row.baseline or "")
        if base is not None and base.c1 is not None:
            delta = row.c1.p50_ms - base.c1.p50_ms
            added = f"{delta:+.3f}" + ("" if row.baseline == "a" else f" vs ({row.baseline})")
        lines.append(
            f"| {row.label} | {row.c1.rps:.0f} | {ms(row.c1.p50_ms)} | {ms(row.c1.p99_ms)} | "
            f"{row.c32.rps:.0f} | {ms(row.c32.p50_ms, 2)} | {ms(row.c32.p99_ms, 2)} | "
            f"{cpu_text(row.cpu1)} | {cpu_text(row.cpu32)} | {added} | "
            f"{'; '.join(row.notes + ([f'rps range @1 {row.spread[0]}, @32 {row.spread[1]}'] if row.spread else []))} |"
        )
    lines.append("")
    lines.append("Added p50@1 is over (a) (for the peer bridges: over the proxy's (g) row; negative = faster).")
    lines.append("")
    mem = bench.memory
    if mem is not None:
        lines.append(
            f"**Memory**: proxy RSS {mem['before_kb'] / 1024:.1f} MiB → {mem['after_kb'] / 1024:.1f} MiB after "
            f"{mem['opened']} idle legacy sessions (initialize only, modern upstream; {mem['failed']} failed; "
            f"opened in {mem['seconds']} s) = **{mem['kb_per_session']:.2f} KB per session**."
        )
        lines.append("")
    targets = judge(rows, mem)
    if targets:
        lines.append("## Targets")
        lines.append("")
        lines.extend(f"- {t}" for t in targets)
        lines.append("")
    if bench.profiles:
        lines.append("## Profiles (py-spy, proxy process, @32)")
        lines.append("")
        for key, summary in bench.profiles.items():
            lines.append(f"**{key}**")
            lines.append("```")
            lines.extend(summary)
            lines.append("```")
        lines.append("")
    return "\n".join(lines), targets


def judge(rows: dict[str, Row], mem: dict[str, Any] | None) -> list[str]:
    out: list[str] = []

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    b = rows.get("b")
    a = rows.get("a")
    for key in ("c", "d", "e"):
        row = rows.get(key)
        if row is None:
            continue
        if b is not None and b.c32 and row.c32:
            ratio = row.c32.rps / b.c32.rps
            out.append(
                f"({key}) rps@32 ≥ 80% of (b): {row.c32.rps:.0f} vs {b.c32.rps:.0f} = {100 * ratio:.0f}% "
                f"→ {verdict(ratio >= 0.8)}"
            )
        if a is not None and a.c1 and row.c1:
            added = row.c1.p50_ms - a.c1.p50_ms
            out.append(f"({key}) added p50@1 < 0.3 ms: {added:.3f} ms → {verdict(added < 0.3)}")
        if b is not None and b.cpu32 and row.cpu32 is not None:
            ratio = row.cpu32 / b.cpu32
            at1 = f"{row.cpu1 / b.cpu1:.2f}x" if b.cpu1 and row.cpu1 is not None else "—"
            out.append(
                f"({key}) CPU/req@32 ≤ 1.25x (b): {row.cpu32:.0f} vs {b.cpu32:.0f} µs = {ratio:.2f}x "
                f"(@1: {cpu_text(row.cpu1)} vs {cpu_text(b.cpu1)} µs = {at1}) → {verdict(ratio <= 1.25)}"
            )
    f = rows.get("f")
    if f is not None and a is not None and f.c1 and f.c32 and a.c1 and a.c32:
        ok = f.c32.rps > a.c32.rps and f.c32.p50_ms < a.c32.p50_ms and f.c1.p50_ms < a.c1.p50_ms
        out.append(
            f"(f) faster than (a): rps@32 {f.c32.rps:.0f} vs {a.c32.rps:.0f}, p50@32 {f.c32.p50_ms:.2f} vs "
            f"{a.c32.p50_ms:.2f} ms, p50@1 {f.c1.p50_ms:.3f} vs {a.c1.p50_ms:.3f} ms → {verdict(ok)}"
        )
    g = rows.get("g")
    bridges = [(name, rows[k]) for k, name in (("g-mcp", "mcp-proxy"), ("g-supergateway", "supergateway")) if k in rows]
    if g is not None and g.c32 and bridges:
        ok = all(g.c32.rps > r.c32.rps for _, r in bridges if r.c32)
        versus = ", ".join(f"{name} {r.c32.rps:.0f}" for name, r in bridges if r.c32)
        out.append(f"(g) proxy ahead of both peer bridges at rps@32: {g.c32.rps:.0f} vs {versus} → {verdict(ok)}")
    if mem is not None and mem.get("kb_per_session") is not None:
        per = mem["kb_per_session"]
        out.append(f"RSS per idle legacy session < 4 KB: {per:.2f} KB → {verdict(per < 4)}")
    return out


def chart(bench: Bench, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in bench.rows if r.c1 and r.c32]
    labels = [r.label.replace(" → ", "\n→ ", 1) for r in rows]
    fig, (left, right, cpu) = plt.subplots(1, 3, figsize=(20, 0.65 * len(rows) + 2), sharey=True)
    positions = range(len(rows))
    height = 0.38
    left.barh([p - height / 2 for p in positions], [r.c1.rps for r in rows], height, label="concurrency 1")
    left.barh([p + height / 2 for p in positions], [r.c32.rps for r in rows], height, label="concurrency 32")
    left.set_xlabel("requests per second")
    left.set_yticks(list(positions), labels, fontsize=8)
    left.invert_yaxis()
    left.legend(loc="lower right")
    left.grid(axis="x", alpha=0.3)
    right.barh([p - height / 2 for p in positions], [r.c1.p50_ms for r in rows], height, label="p50 @1")
    right.barh([p + height / 2 for p in positions], [r.c1.p99_ms for r in rows], height, label="p99 @1")
    right.set_xscale("log")
    right.set_xlabel("latency at concurrency 1 (ms, log scale)")
    right.legend(loc="lower right")
    right.grid(axis="x", alpha=0.3)
    cpu.barh([p - height / 2 for p in positions], [r.cpu1 or 0 for r in rows], height, label="concurrency 1")
    cpu.barh([p + height / 2 for p in positions], [r.cpu32 or 0 for r in rows], height, label="concurrency 32")
    cpu.set_xlabel("CPU µs per request, process under test")
    cpu.legend(loc="lower right")
    cpu.grid(axis="x", alpha=0.3)
    fig.suptitle("mcp-era-proxy benchmark (wrk, 127.0.0.1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="wrk runs per measurement; the median stands")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up load before each scenario")
    parser.add_argument("--sessions", type=int, default=10_000, help="idle legacy sessions for the memory line")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(), help="e.g. a,b,c,mem")
    parser.add_argument("--quick", action="store_true", help="same as --only b,c,d,e: the CPU/req targets")
    parser.add_argument("--profile", action="store_true", help="py-spy the proxy during its @32 runs")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    if args.quick:
        args.only = args.only or {"b", "c", "d", "e"}
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
    text, _ = render(bench, args, facts, started)
    (args.out / "latest.md").write_text(text + "\n")
    runs = {row.key: {"cpu_us@1": row.cpu1, "cpu_us@32": row.cpu32, "runs": row.runs} for row in bench.rows}
    (args.out / "latest-runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    try:
        chart(bench, args.out / "latest.png")
    except ImportError:
        say("matplotlib missing: no chart (install the `bench` extra)")
    print(text)
    say(f"done in {time.time() - started:.0f} s: {args.out / 'latest.md'}, {args.out / 'latest.png'}; logs in {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
