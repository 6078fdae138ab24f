"""A bounded soak: thousands of legacy sessions opened and closed or abandoned, streams and calls
cut by their clients mid-flight, parked calls never resumed; then every resource of the proxy
process is back where it started.

Measured on the proxy process before and after (from /proc and its own /metrics): resident
memory, open descriptors, event-loop tasks, child processes, and every gauge. `SOAK_SESSIONS`
(default 2000) sets the number of HTTP legacy sessions; a tenth as many go to the stdio upstream
(a server process each).
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.protocol import jsonrpc
from tests.support import legacy_client, modern_client, stdio_server, tally
from tests.support.mcp_client import Endpoint, answer_to, metric
from tests.support.procs import serving
from tests.support.raw_http_client import build

SESSIONS = int(os.environ.get("SOAK_SESSIONS", "2000"))
# What a soak may leave behind, measured against the process after its warm-up.
RSS_GROWTH_BOUND = 16 * 1024 * 1024
FD_SLACK = 4
TASK_SLACK = 4
SHORT = {
    "MCP_ERA_PROXY_SESSIONS__IDLE_TIMEOUT_S": "2",
    "MCP_ERA_PROXY_INPUT__PARK_TIMEOUT_S": "2",
    "MCP_ERA_PROXY_UPSTREAM__POOL__IDLE_TIMEOUT_S": "2",
    "MCP_ERA_PROXY_LOGGING__LEVEL": "warning",  # no access log for thousands of requests
}
GAUGES = (
    "mcp_era_proxy_sessions_open",
    "mcp_era_proxy_streams_open",
    "mcp_era_proxy_parked_calls",
    "mcp_era_proxy_upstream_sessions_open",
)


@dataclass
class Running:
    endpoint: Endpoint
    pid: int


@dataclass
class Sample:
    rss: int
    fds: int
    tasks: float
    children: int
    gauges: dict[str, float]

    def line(self) -> str:
        gauges = " ".join(f"{k.removeprefix('mcp_era_proxy_')}={v:g}" for k, v in self.gauges.items())
        return (
            f"rss {self.rss / 2**20:.1f} MiB, fds {self.fds}, tasks {self.tasks:g}, children {self.children}, {gauges}"
        )


def sample(proxy: Running) -> Sample:
    status = Path(f"/proc/{proxy.pid}/status").read_text()
    rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024
    fds = len(os.listdir(f"/proc/{proxy.pid}/fd"))
    text = proxy.endpoint.metrics()
    return Sample(
        rss,
        fds,
        metric(text, "mcp_era_proxy_event_loop_tasks"),
        children_of(proxy.pid),
        {g: metric(text, g) for g in GAUGES},
    )


def children_of(pid: int) -> int:
    count = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in status:
            count += 1
    return count


@pytest.fixture(scope="module")
def soak_proxies(logs_dir: Path, fixture_modern: str, fixture_legacy: str) -> Iterator[dict[str, Running]]:
    """Proxies in front of an HTTP modern upstream, an HTTP legacy one, and a stdio legacy one."""
    stdio = shlex.join([sys.executable, str(Path(stdio_server.__file__))])  # legacy by default
    targets = {
        "modern-http": ["--upstream", fixture_modern],
        "legacy-http": ["--upstream", fixture_legacy],
        "legacy-stdio": ["--upstream-command", stdio, "--upstream-era", "legacy"],
    }
    running: dict[str, Running] = {}
    with ExitStack() as stack:
        for name, target in targets.items():
            argv = [sys.executable, "-m", "proxy", *target, "--listen", "127.0.0.1:0"]
            log = logs_dir / f"soak-{name}.log"
            # Its one listener is found by its socket: at level warning it logs no `listening` line.
            process = stack.enter_context(serving(argv, log, env=SHORT))
            running[name] = Running(Endpoint(f"http://127.0.0.1:{process.port}/mcp"), process.proc.pid)
        yield running


def _cut_after_headers(endpoint: Endpoint, session: str, body: bytes) -> None:
    """Send a request and hang up as soon as its reply starts: a client gone mid-flight."""
    raw = build(
        "POST",
        endpoint.path,
        [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", session),
        ],
        body,
    )
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as sock:
        sock.sendall(raw)
        sock.recv(64)


def legacy_cycle(endpoint: Endpoint, n: int, tool: str, streaming_tool: str) -> None:
    """One legacy session's life: most are closed, some abandoned, some cut mid-call or mid-stream."""
    session = legacy_client.open_session(endpoint)
    listed = legacy_client.call(endpoint, session, 1, "tools/list")
    assert listed.status == 200, listed
    called = legacy_client.call(endpoint, session, 2, "tools/call", {"name": tool, "arguments": {"text": "soak"}})
    assert answer_to(called, 2) is not None, called
    kind = n % 10
    if kind == 7:  # a call with progress, cut by the client once its stream starts
        body = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"' + streaming_tool.encode()
        body += b'","arguments":{},"_meta":{"progressToken":"p"}}}'
        _cut_after_headers(endpoint, session, body)
    elif kind == 8:  # a GET stream, cut
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as sock:
            sock.sendall(build("GET", endpoint.path, [("Accept", "text/event-stream"), ("Mcp-Session-Id", session)]))
            sock.recv(64)
    if kind in (0, 1):
        return  # abandoned: left to expire
    assert legacy_client.delete(endpoint, session).status in (200, 204), "DELETE failed"


def parked_cycle(endpoint: Endpoint, n: int) -> None:
    """A modern call the legacy upstream parks on an elicitation; the client never comes back."""
    params = {"name": "test_elicitation", "arguments": {"message": "who?"}}
    reply = modern_client.call(endpoint, n, "tools/call", params, {"elicitation": {"form": {}}})
    answer = answer_to(reply, n)
    assert answer is not None, reply.body[:300]
    if answer.get("error", {}).get("code") == jsonrpc.LIMIT_EXCEEDED:
        tally.count("soak.refused_at_bound")  # upstream.pool.max_per_key parked calls for this caller
        return
    assert answer.get("result", {}).get("resultType") == "input_required", reply.body[:300]


def run_many(work: Callable[[int], None], count: int) -> None:
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(work, n) for n in range(count)]:
            future.result(timeout=120)


def settled(proxy: Running, baseline: Sample, bound_s: float = 60.0) -> Sample:
    """The proxy's sample once it is back to `baseline`: every gauge zero, no child left, and idle
    upstream connections closed by their keep-alive timeout (a bounded wait; the last sample if not)."""
    deadline = time.monotonic() + bound_s
    while True:
        now = sample(proxy)
        back = (
            all(v == 0 for v in now.gauges.values())
            and now.children <= baseline.children
            and now.fds <= baseline.fds + FD_SLACK
            and now.tasks <= baseline.tasks + TASK_SLACK
        )
        if back or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


@pytest.mark.timeout(900)
def test_soak_leaves_nothing_behind(soak_proxies: dict[str, Running]) -> None:
    plans: dict[str, tuple[Callable[[int], None], int]] = {
        "modern-http": (
            lambda n: legacy_cycle(
                soak_proxies["modern-http"].endpoint, n, "test_simple_text", "test_tool_with_progress"
            ),
            SESSIONS,
        ),
        "legacy-stdio": (
            lambda n: legacy_cycle(soak_proxies["legacy-stdio"].endpoint, n, "echo", "echo"),
            SESSIONS // 10,
        ),
        "legacy-http": (lambda n: parked_cycle(soak_proxies["legacy-http"].endpoint, n), SESSIONS // 5),
    }
    baselines: dict[str, Sample] = {}
    for name, (work, _count) in plans.items():
        run_many(work, 40)  # warm-up: first-use allocations, pools, caches
        baselines[name] = settled(soak_proxies[name], sample(soak_proxies[name]))
    took: dict[str, float] = {}
    for name, (work, count) in plans.items():
        started = time.monotonic()
        run_many(work, count)
        took[name] = time.monotonic() - started
        tally.count("soak.cycles", count)
    for name, (_work, count) in plans.items():
        before, after = baselines[name], settled(soak_proxies[name], baselines[name])
        tally.note(f"soak {name} ({count} cycles in {took[name]:.0f} s): before: {before.line()}")
        tally.note(f"soak {name} ({count} cycles): after:  {after.line()}")
        assert all(v == 0 for v in after.gauges.values()), f"{name}: gauges not back to zero: {after.gauges}"
        assert after.children <= before.children, f"{name}: {after.children - before.children} child processes left"
        assert after.fds <= before.fds + FD_SLACK, f"{name}: descriptors {before.fds} -> {after.fds}"
        assert after.tasks <= before.tasks + TASK_SLACK, f"{name}: tasks {before.tasks} -> {after.tasks}"
        assert after.rss - before.rss <= RSS_GROWTH_BOUND, (
            f"{name}: RSS grew {(after.rss - before.rss) / 2**20:.1f} MiB"
        )
