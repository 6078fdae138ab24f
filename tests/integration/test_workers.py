"""--workers 2 from the command line: a supervisor and two workers sharing the MCP port, a real
redis-server as the store. Both workers serve, a killed worker is replaced, SIGTERM ends them all
with exit 0 and no process left, and a worker never outlives its supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from proxy.config import ENV_PREFIX
from tests.support.procs import reserved_port, reserved_ports, serving
from tests.support.redis_server import redis_server

REPO = Path(__file__).resolve().parents[2]
SECRET = "workers-test-secret-0123456789"
MODERN = "2026-07-28"
T = TypeVar("T")


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not reaped yet, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def poll(what: str, check: Callable[[], T | None], timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := check()) is not None and found is not False:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("upstream") / "upstream.log"
    argv = [sys.executable, "-m", "tests.support.fault_upstream", "--era", "modern", "--port", "0"]
    with serving(argv, log, cwd=REPO, timeout=20) as server:
        yield f"http://127.0.0.1:{server.port}/mcp"


@dataclass
class Supervised:
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    admin: int

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def events(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == event]

    def workers(self) -> dict[int, int]:
        """worker index -> pid of its latest start."""
        return {line["worker"]: line["pid"] for line in self.events("worker_started")}


def start(tmp_path: Path, redis_url: str, upstream: str, *extra: str, admin: int | None = None) -> Supervised:
    # Known ports, not port 0: the workers share the MCP port and take admin and internal + i.
    port = reserved_port()
    admin = admin or reserved_ports(2)
    internal = reserved_ports(2)
    log = tmp_path / "proxy.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env = {
        **clean,
        f"{ENV_PREFIX}SECURITY__SECRET": SECRET,
        f"{ENV_PREFIX}STORE__URL": redis_url,
        f"{ENV_PREFIX}REPLICAS__INTERNAL_LISTEN": f"127.0.0.1:{internal}",
        f"{ENV_PREFIX}UPSTREAM__ERA": "modern",
        f"{ENV_PREFIX}SHUTDOWN__GRACE_S": "5",
    }
    argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--listen", f"127.0.0.1:{port}"]
    argv += ["--admin-listen", f"127.0.0.1:{admin}", "--workers", "2", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
    return Supervised(proc, log, port, admin)


@contextlib.contextmanager
def running(tmp_path: Path, redis_url: str, upstream: str) -> Iterator[Supervised]:
    proxy = start(tmp_path, redis_url, upstream)
    try:
        poll("two workers listening", lambda: len(proxy.workers()) == 2 or None)
        yield proxy
    finally:
        pids = [proxy.proc.pid, *proxy.workers().values()]
        if proxy.proc.poll() is None:
            os.killpg(proxy.proc.pid, signal.SIGKILL)
            proxy.proc.wait(10)
        for pid in pids:  # workers that outlived the test: by pid, never by name
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def call(session: aiohttp.ClientSession, url: str, request_id: int) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hi"}, "_meta": meta},
    }
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN}
    headers |= {"Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    async with session.post(url, json=message, headers=headers) as reply:
        assert reply.status == 200, await reply.text()
        assert b'"result"' in await reply.read()


async def calls_per_worker(proxy: Supervised, count: int) -> dict[int, float]:
    """`count` calls, each on a new connection (the kernel picks the worker per connection), then
    the tools/call count of each worker's own /metrics (worker i: admin port + i)."""
    url = f"http://127.0.0.1:{proxy.port}/mcp"
    connector = aiohttp.TCPConnector(force_close=True, limit=16)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as session:
        await asyncio.gather(*(call(session, url, i) for i in range(count)))
        served = {}
        for index in (0, 1):
            async with session.get(f"http://127.0.0.1:{proxy.admin + index}/metrics") as reply:
                text = await reply.text()
            served[index] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("mcp_era_proxy_requests_total{") and 'method="tools/call"' in line
            )
    return served


async def test_two_workers_share_the_port_a_killed_one_is_replaced_and_sigterm_ends_all(
    tmp_path: Path, redis_url: str, upstream: str
) -> None:
    with running(tmp_path, redis_url, upstream) as proxy:
        supervisor_pid = proxy.proc.pid
        first = proxy.workers()
        assert supervisor_pid not in first.values() and len(set(first.values())) == 2
        served = await calls_per_worker(proxy, 64)
        assert sum(served.values()) == 64 and all(served.values()), served  # both served, and only they
        logged = {line.get("worker") for line in proxy.events("request")}
        assert logged == {0, 1}, logged  # every worker's request lines carry its index

        os.kill(first[1], signal.SIGKILL)
        poll("worker 1 replaced", lambda: proxy.workers()[1] != first[1] or None)
        second = proxy.workers()
        assert not alive(first[1]) and alive(second[1]) and second[0] == first[0]
        exited = proxy.events("worker_exited")
        assert [(e["worker"], e["code"]) for e in exited] == [(1, -signal.SIGKILL)], exited
        served = await calls_per_worker(proxy, 64)
        assert served[1] > 0, served  # the new worker 1 serves (its counters start from zero)

        os.kill(supervisor_pid, signal.SIGTERM)
        code = await asyncio.to_thread(proxy.proc.wait, 30)
        assert code == 0, proxy.log.read_text()
        assert not any(alive(pid) for pid in second.values())
        stopped = {(e["worker"], e["pid"], e["code"]) for e in proxy.events("worker_stopped")}
        assert stopped == {(0, second[0], 0), (1, second[1], 0)}, stopped
        assert proxy.events("stopped")[-1].get("ok") is True


async def test_a_legacy_session_opened_on_one_worker_is_served_by_both(
    tmp_path: Path, redis_url: str, upstream: str
) -> None:
    """The workers are replicas of the store: the session lives in Redis, not in the worker that
    answered `initialize`, so every call of it succeeds whichever worker takes its connection."""
    legacy = "2025-11-25"
    accept = {"Accept": "application/json, text/event-stream"}
    with running(tmp_path, redis_url, upstream) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        connector = aiohttp.TCPConnector(force_close=True, limit=16)  # a new connection, a worker drawn, per request
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as session:
            params = {"protocolVersion": legacy, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
            initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
            async with session.post(url, json=initialize, headers=accept) as reply:
                assert reply.status == 200, await reply.text()
                session_id = reply.headers["Mcp-Session-Id"]
            headers = {**accept, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": legacy}
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            async with session.post(url, json=initialized, headers=headers) as reply:
                assert reply.status == 202, await reply.text()

            async def call(request_id: int) -> None:
                message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
                message["params"] = {"name": "echo", "arguments": {"text": "hi"}}
                async with session.post(url, json=message, headers=headers) as reply:
                    assert reply.status == 200, await reply.text()
                    assert (await reply.json())["result"]["content"][0]["text"] == "hi"

            await asyncio.gather(*(call(i) for i in range(1, 49)))

        def logged() -> list[dict[str, Any]] | None:  # a line is written a few ms after its answer
            calls = [line for line in proxy.events("request") if line.get("method") == "tools/call"]
            return calls if len(calls) >= 48 else None

        calls = await asyncio.to_thread(poll, "a request line for each call", logged)
        assert len(calls) == 48 and {line["worker"] for line in calls} == {0, 1}, calls


def test_workers_drain_and_exit_when_their_supervisor_is_killed(tmp_path: Path, redis_url: str, upstream: str) -> None:
    with running(tmp_path, redis_url, upstream) as proxy:
        pids = list(proxy.workers().values())
        os.kill(proxy.proc.pid, signal.SIGKILL)
        proxy.proc.wait(10)
        poll("every worker gone", lambda: not any(alive(pid) for pid in pids) or None)
        assert len(proxy.events("supervisor_gone")) == 2


def test_a_worker_that_cannot_listen_stops_them_all_with_exit_1(tmp_path: Path, redis_url: str, upstream: str) -> None:
    admin = reserved_ports(2)
    with socket.socket() as taken:  # worker 1's admin port, bound without SO_REUSEPORT
        taken.bind(("127.0.0.1", admin + 1))
        taken.listen()
        proxy = start(tmp_path, redis_url, upstream, admin=admin)
        try:
            code = proxy.proc.wait(30)
        finally:
            if proxy.proc.poll() is None:
                os.killpg(proxy.proc.pid, signal.SIGKILL)
                proxy.proc.wait(10)
    assert code == 1, proxy.log.read_text()
    assert [e["worker"] for e in proxy.events("worker_cannot_start")] == [1]
    assert not any(alive(pid) for pid in proxy.workers().values())


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--upstream", "http://127.0.0.1:1/mcp", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
        cwd=REPO,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({f"{ENV_PREFIX}SECURITY__SECRET": SECRET}, "workers > 1 needs store.url"),
        ({f"{ENV_PREFIX}STORE__URL": "redis://127.0.0.1:1/0"}, "security.secret is required"),
    ],
)
def test_more_workers_without_the_store_or_the_secret_are_refused_at_start(env: dict[str, str], message: str) -> None:
    done = run_cli("--workers", "2", env=env)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("control", ["nonsense", "0:999", "0:-3"])
def test_the_hidden_worker_flag_given_by_hand_is_refused_without_a_traceback(control: str) -> None:
    done = run_cli("--worker-control", control, env={})
    assert done.returncode == 2
    assert "set by the supervisor of --workers" in done.stderr and "Traceback" not in done.stderr
