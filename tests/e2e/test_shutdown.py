"""SIGTERM with work in progress: readiness turns false and the MCP port stops accepting at once, the
call completes, the subscription is closed gracefully, and the proxy exits 0 within its grace period."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.protocol import meta
from tests.support import peers
from tests.support.procs import Process, proxy_listener, serving
from tests.support.sdk_drivers import finished, legacy_client_argv, modern_client_argv, started, until_progress

from .conftest import stdio_command
from .test_concurrent_modern_clients import ModernClient

pytestmark = pytest.mark.e2e
GRACE_S = 15


async def sse_messages(response: aiohttp.ClientResponse) -> Any:
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            for line in event.splitlines():
                if line.startswith(b"data:") and line[5:].strip():  # not a priming event (no data)
                    yield json.loads(line[5:])


async def read_until_final(response: aiohttp.ClientResponse, request_id: Any, started: asyncio.Event) -> dict:
    async for message in sse_messages(response):
        if message.get("method") == "notifications/progress":
            started.set()
        elif message.get("id") == request_id:
            return message
    raise AssertionError("the call's stream ended without its result")


async def readiness_while_draining(http: aiohttp.ClientSession, readyz: str, call: asyncio.Task[dict]) -> dict:
    """The first /readyz answer that is not 200, polled (bounded) while the call is still running."""
    async with asyncio.timeout(GRACE_S):
        while not call.done():
            async with http.get(readyz) as response:
                if response.status != 200:
                    return {"status": response.status, **await response.json()}
            await asyncio.sleep(0.05)
    raise AssertionError("/readyz stayed 200 until the call in flight had finished")


def child_pids(pid: int) -> set[int]:
    """The live children of `pid` (Linux /proc): the stdio servers a proxy started."""
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children.update(int(child) for child in (task / "children").read_text().split())
    return children


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's reaping is pending


async def read_listen(response: aiohttp.ClientResponse, acknowledged: asyncio.Event) -> list[dict]:
    seen = []
    async for message in sse_messages(response):
        seen.append(message)
        if message.get("method") == "notifications/subscriptions/acknowledged":
            acknowledged.set()
    return seen


@pytest.mark.parametrize("upstream_kind", ["http", "stdio"])
async def test_sigterm_lets_the_call_finish_closes_the_subscription_gracefully_and_exits_zero(
    request: pytest.FixtureRequest, upstream_kind: str, logs_dir: Path
) -> None:
    if upstream_kind == "http":
        target = ["--upstream", request.getfixturevalue("legacy_server")]
    else:
        target = ["--upstream-command", stdio_command(peers.mcp1_python(), "legacy_server.py")]
    argv = [sys.executable, "-m", "proxy", *target, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
    log = logs_dir / f"shutdown-{upstream_kind}.log"
    with serving(argv, log, env={"MCP_ERA_PROXY_SHUTDOWN__GRACE_S": str(GRACE_S)}, announced=proxy_listener()) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        readyz = f"http://127.0.0.1:{proxy.announced(proxy_listener('admin'))}/readyz"
        async with aiohttp.ClientSession() as http:
            client = ModernClient(http, url, "draining", {})
            # Long enough to watch the draining while it runs, well inside the grace period.
            call, call_headers = client.request_body(
                "tools/call", {"name": "slow", "arguments": {"seconds": 5}}, progress=True
            )
            listen, listen_headers = client.request_body(
                "subscriptions/listen", {"notifications": {"toolsListChanged": True}}
            )
            started, acknowledged = asyncio.Event(), asyncio.Event()
            async with (
                http.post(url, data=json.dumps(call), headers=call_headers) as call_response,
                http.post(url, data=json.dumps(listen), headers=listen_headers) as listen_response,
            ):
                final = asyncio.create_task(read_until_final(call_response, call["id"], started))
                stream = asyncio.create_task(read_listen(listen_response, acknowledged))
                async with asyncio.timeout(20):
                    await started.wait()
                    await acknowledged.wait()
                async with http.get(readyz) as response:
                    assert response.status == 200, await response.text()
                stdio_servers = child_pids(proxy.proc.pid)
                proxy.proc.send_signal(signal.SIGTERM)
                draining = await readiness_while_draining(http, readyz, final)
                with pytest.raises(aiohttp.ClientConnectionError):
                    # A new connection (not a pooled one) to the MCP port: refused while draining.
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                        async with fresh.post(url, data=json.dumps(call), headers=call_headers):
                            pass
                assert not final.done(), "the call ended before the draining could be observed"
                async with asyncio.timeout(GRACE_S):
                    result = await final
                    listened = await stream
        exit_code = await asyncio.to_thread(proxy.proc.wait, GRACE_S)
        # Looked at before the harness's process-group kill: the proxy must have stopped them itself.
        left_running = [pid for pid in stdio_servers if running(pid)]
    assert draining == {
        "status": 503, "ready": False, "draining": True, "upstream": draining["upstream"],
        "upstream_era": "legacy",
    }  # fmt: skip
    assert result["result"]["content"][0]["text"] == "slow done", result
    closing = listened[-1]
    assert closing == {
        "jsonrpc": "2.0",
        "id": listen["id"],
        "result": {"resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: listen["id"]}},
    }
    assert exit_code == 0
    if upstream_kind == "stdio":
        assert stdio_servers, "the proxy had no stdio server running"
    assert left_running == []
    assert "stopped" in (logs_dir / f"shutdown-{upstream_kind}.log").read_text()


def test_an_idle_proxy_stops_on_sigterm_with_exit_code_zero(logs_dir: Path) -> None:
    """Even with its upstream unreachable (nothing to drain)."""
    with socket.socket() as closed:  # bound, never listening: connections to it are refused
        closed.bind(("127.0.0.1", 0))
        upstream = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"
        argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"]
        process = Process([*argv, "--upstream-era", "modern"], logs_dir / "shutdown-idle.log")
        try:
            process.wait_listening(30, announced=proxy_listener())
            process.proc.send_signal(signal.SIGTERM)
            assert process.proc.wait(GRACE_S) == 0
        finally:
            process.stop()


CUT_GRACE_S = 3


def test_calls_longer_than_the_grace_get_an_error_the_sdk_clients_report_and_a_short_one_completes(
    legacy_server: str, logs_dir: Path
) -> None:
    """SIGTERM with a 1.5 s call and two 30 s calls in flight (the mcp 1.30 legacy client's and the
    mcp 2.3 modern client's), grace 3 s: the short call completes, each long one gets -32014 before
    its connection closes, which its SDK reports (no hang), and the proxy exits 0."""
    argv = [sys.executable, "-m", "proxy", "--upstream", legacy_server, "--listen", "127.0.0.1:0"]
    log = logs_dir / "shutdown-cut.log"
    env = {"MCP_ERA_PROXY_SHUTDOWN__GRACE_S": str(CUT_GRACE_S)}
    with serving(argv, log, env=env, announced=proxy_listener()) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        long_call = {"tool": "slow", "arguments": {"seconds": 30}}
        drivers = {
            "legacy": started(legacy_client_argv(url, "progress", long_call, 60.0)),
            "modern": started(modern_client_argv(url, "progress", long_call, 60.0)),
        }
        for driver in drivers.values():
            until_progress(driver, 30.0)  # its call runs upstream

        async def short_call() -> dict[str, Any]:
            async with aiohttp.ClientSession() as http:
                client = ModernClient(http, url, "short", {})
                call, headers = client.request_body("tools/call", {"name": "slow", "arguments": {"seconds": 1.5}})
                async with http.post(url, data=json.dumps(call), headers=headers) as response:
                    text = await response.text()
            data = [line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
            return json.loads(data[-1]) if data else json.loads(text)

        async def short_then_sigterm() -> dict[str, Any]:
            call = asyncio.create_task(short_call())
            await asyncio.sleep(0.3)  # the short call is on its way before the signal
            proxy.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(CUT_GRACE_S + 10):
                return await call

        short = asyncio.run(short_then_sigterm())
        cut = {era: finished(driver, CUT_GRACE_S + 15.0) for era, driver in drivers.items()}
        exit_code = proxy.proc.wait(CUT_GRACE_S + 10)
    assert short["result"]["content"][0]["text"] == "slow done", short
    for era, observed in cut.items():
        assert "error" in observed, (era, observed)
        text = json.dumps(observed["error"])
        assert "-32014" in text or "shutting down" in text, (era, observed)
    assert exit_code == 0
    assert log.read_text().count("call_cut_at_shutdown") == 2
