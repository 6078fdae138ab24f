"""The proxy in front of a stdio server it starts itself, driven over HTTP: a command that cannot be
started, and the bounds on the server processes legacy sessions hold (proxy/relay/connection_sessions.py,
proxy/relay/legacy_sessions.py; docs/get-started/in-front-of-your-server.md, stdio upstreams).

The server is tests/support/stdio_server.py, run with this interpreter.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from proxy.app import CONNECTION_SESSIONS, METRICS, create_app
from proxy.config import load_settings
from proxy.errors import SESSION_NOT_FOUND
from proxy.metrics import PREFIX
from proxy.protocol import jsonrpc
from proxy.relay.legacy_sessions import LegacySessionHost
from tests.support.legacy_client import LegacyClient, error_body, initialize_message, read_reply
from tests.support.mcp_client import ACCEPT, PATH, SseReader
from tests.support.modern_client import ModernClient

from .conftest import FakeClock, serve
from .test_stdio_upstream import alive

SERVER = Path(__file__).resolve().parents[1] / "support" / "stdio_server.py"
NAME = "scripted-stdio"
WAIT = 10.0  # bound on every wait; the happy paths take milliseconds
LEGACY_SERVER = {"upstream.command": [sys.executable, str(SERVER)], "upstream.era": "legacy"}

MakeProxy = Callable[..., Awaitable[Any]]


@dataclass
class Proxy:
    app: web.Application
    client: TestClient

    async def connect(self) -> LegacyClient:
        return await LegacyClient.connect(self.client)

    @property
    def sessions(self) -> LegacySessionHost[Any]:
        """The host of the legacy sessions that are a server process each."""
        return self.app[CONNECTION_SESSIONS]

    def processes(self) -> float:
        return self.app[METRICS].registry.get_sample_value(f"{PREFIX}upstream_processes", {"upstream": NAME}) or 0.0


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any) -> MakeProxy:
    """`await make_proxy(command, **settings)`: the proxy, served, starting `command` over stdio."""

    async def build(command: list[str] | None = None, *, clock: Any = None, **overrides: Any) -> Proxy:
        settings = load_settings(
            None,
            **{"upstream.command": command, "upstream.name": NAME, "cache.watch": False, **overrides},
        )
        app, admin = create_app(settings, **({"clock": clock} if clock is not None else {}))
        assert admin is None
        return Proxy(app, await aiohttp_client(await serve(aiohttp_server, app)))

    return build


def write_server(path: Path) -> None:
    """An executable at `path` that runs the scripted server."""
    path.write_text(f"#!{sys.executable}\n" + SERVER.read_text())
    path.chmod(0o755)


async def legacy_initialize(client: Any) -> tuple[int, dict[str, Any]]:
    response = await client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
    reply = await read_reply(response, None, "initialize", 0)
    assert reply.final is not None, reply.messages
    return response.status, reply.final


# ---------------------------------------------------------------- a command that cannot be started


async def proxy_to_missing(make_proxy: MakeProxy, command: Path, era: str) -> TestClient:
    server_era = "legacy" if era == "auto" else era
    settings = {"upstream.era": era, "upstream.env": {"STDIO_SERVER_ERA": server_era}, "upstream.probe_timeout_s": 2.0}
    return (await make_proxy([str(command), "--stdio"], **settings)).client


@pytest.mark.parametrize("era", ["auto", "legacy", "modern"])
async def test_a_missing_command_is_upstream_unavailable_naming_it(make_proxy: MakeProxy, tmp_path: Path, era: str):
    # Before: under auto the era probe started it outside its error handling, and every request got a 500.
    command = tmp_path / "mcp-server"
    client = await proxy_to_missing(make_proxy, command, era)
    for _ in range(2):  # and again: nothing of the failure is kept
        status, reply = await legacy_initialize(client)
        assert status == 200, reply
        assert reply["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
        # argv[0] and the system's reason, whatever the event loop's exception says (uvloop: no name)
        expected = f"upstream {NAME!r} could not start {str(command)!r}: No such file or directory"
        assert reply["error"]["message"] == expected
        modern = await ModernClient(client).request("tools/call", {"name": "pid", "arguments": {}})
        assert modern.status == 200
        assert modern.error == {"code": jsonrpc.UPSTREAM_UNAVAILABLE, "message": expected}


# A modern server's one process is tried again after its restart backoff: test_stdio_upstream.py.
@pytest.mark.parametrize("era", ["auto", "legacy"])
async def test_a_missing_command_is_used_once_it_exists_without_a_restart(
    make_proxy: MakeProxy, tmp_path: Path, era: str
):
    command = tmp_path / "mcp-server"
    client = await proxy_to_missing(make_proxy, command, era)
    status, reply = await legacy_initialize(client)
    assert reply["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    write_server(command)  # the command appears: served from the next request on
    status, reply = await legacy_initialize(client)
    assert status == 200 and "result" in reply, reply
    modern = await ModernClient(client).request("tools/call", {"name": "pid", "arguments": {}})
    assert modern.status == 200
    pid = int(modern.result["content"][0]["text"])
    assert pid > 0 and pid != os.getpid()


# ---------------------------------------------------------------- the server processes of legacy sessions


async def pid_of(peer: LegacyClient) -> int:
    """The pid of the server process serving the session."""
    reply = await peer.request("tools/call", {"name": "pid", "arguments": {}})
    return int(reply.result["content"][0]["text"])


async def gone(peer: LegacyClient) -> bool:
    """The session is not found any more (404 with -32001: the client starts a new one)."""
    response = await peer.post(jsonrpc.request(peer.next_id(), "ping"))
    return response.status == 404 and (await error_body(response))["code"] == SESSION_NOT_FOUND


async def test_at_the_process_bound_a_new_session_stops_the_least_recently_used_idle_sessions_process(
    make_proxy: MakeProxy,
):
    proxy = await make_proxy(**LEGACY_SERVER, **{"upstream.stdio.max_processes": 2})
    first, second = await proxy.connect(), await proxy.connect()
    first_pid, second_pid = await pid_of(first), await pid_of(second)
    assert await pid_of(first) == first_pid  # the first is the most recently used now
    assert proxy.processes() == 2
    with capture_logs() as logs:
        third = await proxy.connect()
    assert not alive(second_pid)  # stopped (and reaped) before the third's process started
    assert [e["reason"] for e in logs if e["event"] == "session_closed"] == ["evicted"]
    assert await gone(second)
    assert await pid_of(first) == first_pid
    assert await pid_of(third) not in (first_pid, second_pid)
    assert proxy.processes() == 2


async def test_at_the_process_bound_with_every_process_busy_a_new_session_gets_503(make_proxy: MakeProxy):
    proxy = await make_proxy(**LEGACY_SERVER, **{"upstream.stdio.max_processes": 1})
    busy = await proxy.connect()
    held_id, held = await busy.send("tools/call", {"name": "hold", "arguments": {}, "_meta": {"progressToken": "h"}})
    async with asyncio.timeout(WAIT):
        progress = await SseReader(held).message()  # the call is running on the server
    assert progress is not None and progress["method"] == "notifications/progress"

    response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
    assert response.status == 503
    error = await error_body(response)
    assert error["code"] == jsonrpc.LIMIT_EXCEEDED and "busy" in error["message"]
    assert proxy.processes() == 1

    assert await busy.notify("notifications/cancelled", {"requestId": held_id}) == 202
    async with asyncio.timeout(WAIT):
        assert await SseReader(held).message() is None  # cancelled: the stream ends without a reply
    newcomer = await proxy.connect()  # the idle session makes room now
    assert await pid_of(newcomer) > 0
    assert await gone(busy)


async def test_a_sessions_process_idle_past_process_idle_s_is_stopped_sooner_than_sessions_expire(
    make_proxy: MakeProxy,
):
    clock = FakeClock()
    proxy = await make_proxy(
        **LEGACY_SERVER, **{"upstream.stdio.process_idle_s": 60, "sessions.idle_timeout_s": 1800}, clock=clock
    )
    idle, used = await proxy.connect(), await proxy.connect()
    idle_pid = await pid_of(idle)
    clock.advance(59)
    used_pid = await pid_of(used)
    clock.advance(2)  # idle for 61 s, used 2 s ago
    assert await proxy.sessions.reap() == 1  # what the housekeeping does every process_idle_s / 4
    assert not alive(idle_pid)
    assert await gone(idle)
    assert await pid_of(used) == used_pid
    assert proxy.processes() == 1


async def test_readiness_polls_during_a_slow_start_wait_for_the_one_probe_instead_of_restarting_the_server(
    make_proxy: MakeProxy, tmp_path: Path
):
    """`npx -y some-server` on a cold cache takes seconds before it reads stdin. A /readyz poll that
    gave up (its own probe timeout) used to cancel the era probe, killing the server, and the next
    poll started another: now the polls are answered (503) within their bound, the probe goes on,
    and one process probes, one serves."""
    starts = tmp_path / "starts"
    proxy = await make_proxy(
        [sys.executable, str(SERVER)],
        **{
            "upstream.era": "auto",
            "upstream.env": {"STDIO_SERVER_START_DELAY_S": "2", "STDIO_SERVER_STARTS": str(starts)},
            "readiness.probe_timeout_s": 0.3,
        },
    )
    statuses = []
    async with asyncio.timeout(WAIT * 2):
        while not statuses or statuses[-1] != 200:
            response = await proxy.client.get("/readyz")
            statuses.append(response.status)
            if response.status != 200:
                await asyncio.sleep(0.2)  # a poller's interval
    assert statuses[0] == 503 and statuses[-1] == 200, statuses
    started = starts.read_text().split()
    # The era probe's process, taken by readiness's pooled session (its initialize the probe's).
    assert len(started) == 1, (len(started), statuses)


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_legacy_client_s_first_initialize_is_served_by_the_process_the_era_probe_started(
    make_proxy: MakeProxy, tmp_path: Path, era: str
) -> None:
    """A server slow to start (`npx -y` on a cold cache) is started once: the era probe writes the
    client's own initialize after its server/discover, and the process that answered serves the
    client (legacy: its session; 2026-07-28: the one shared process), with readiness polled
    meanwhile."""
    starts = tmp_path / "starts"
    proxy = await make_proxy(
        [sys.executable, str(SERVER)],
        **{
            "upstream.era": "auto",
            "upstream.env": {
                "STDIO_SERVER_ERA": era,
                "STDIO_SERVER_START_DELAY_S": "1",
                "STDIO_SERVER_STARTS": str(starts),
            },
            "readiness.probe_timeout_s": 0.2,
        },
    )

    async def poll() -> list[int]:
        statuses = []
        while not statuses or statuses[-1] != 200:
            statuses.append((await proxy.client.get("/readyz")).status)
            if statuses[-1] != 200:
                await asyncio.sleep(0.1)  # a poller's interval
        return statuses

    async with asyncio.timeout(WAIT):
        polling = asyncio.create_task(poll())  # an operator's probe, from the start
        peer = await proxy.connect()
        polls = await polling
        served_by = await pid_of(peer)
    (started,) = starts.read_text().split()  # one process, the probe's
    assert int(started) == served_by and polls[-1] == 200
    assert proxy.processes() == 1
