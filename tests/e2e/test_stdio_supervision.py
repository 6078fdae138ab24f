"""stdio servers started by the proxy: a killed child fails its calls at once, comes back for the
next request, and leaves no process or file descriptor behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.protocol import jsonrpc
from tests.support import peers
from tests.support.procs import proxy_listener, serving

from .conftest import stdio_command
from .test_concurrent_modern_clients import ModernClient

pytestmark = pytest.mark.e2e
WAIT = 20


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc (children of children included)."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            frontier += list(children - found)
            found |= children
    return {p for p in found if Path(f"/proc/{p}").exists() and _state(p) != "Z"}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def zombies(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split() if _state(int(c)) == "Z"}
        except OSError:
            continue
    return out


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and _state(pid) != "Z"


async def wait_until(predicate: Any, limit: float = WAIT) -> None:
    """Poll /proc (there is nothing to await on) until `predicate` holds, at most `limit` seconds."""
    async with asyncio.timeout(limit):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def first_progress_then_final(
    response: aiohttp.ClientResponse, request_id: Any, progressed: asyncio.Event
) -> dict[str, Any]:
    """Read an SSE reply: set `progressed` at the first progress notification, return the final."""
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            for line in event.splitlines():
                if line.startswith(b"data:") and line[5:].strip():  # not a priming event (no data)
                    message = json.loads(line[5:])
                    if message.get("method") == "notifications/progress":
                        progressed.set()
                    elif message.get("id") == request_id:
                        return message
    raise AssertionError("the stream ended without a reply")


def proxy_argv(command: str) -> list[str]:
    return [sys.executable, "-m", "proxy", "--upstream-command", command, "--listen", "127.0.0.1:0"]


async def test_killing_a_legacy_stdio_server_mid_call_fails_that_call_at_once_and_the_next_call_works(
    logs_dir: Path,
) -> None:
    with serving(
        proxy_argv(stdio_command(peers.mcp1_python(), "legacy_server.py")),
        logs_dir / "supervision-legacy.log",
        announced=proxy_listener(),
    ) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        pid = proxy.proc.pid
        async with aiohttp.ClientSession() as http:
            client = ModernClient(http, url, "killer", {"sampling": {}})
            status, warm = await client.call("tools/call", {"name": "echo", "arguments": {"text": "warm"}})
            assert status == 200 and "result" in warm, warm
            await wait_until(lambda: len(descendants(pid)) == 1)  # the era probe's process is gone
            fds_before = open_fds(pid)
            body, headers = client.request_body(
                "tools/call", {"name": "slow", "arguments": {"seconds": 60}}, progress=True
            )
            progressed = asyncio.Event()
            async with http.post(url, data=json.dumps(body), headers=headers) as response:
                slow = asyncio.create_task(first_progress_then_final(response, body["id"], progressed))
                async with asyncio.timeout(WAIT):
                    await progressed.wait()  # the call is running in the server process
                for child in descendants(pid):
                    os.kill(child, signal.SIGKILL)
                async with asyncio.timeout(WAIT):  # promptly: long before the 60 s call would end
                    failed = await slow
            assert failed["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, failed
            status, after = await client.call("tools/call", {"name": "echo", "arguments": {"text": "again"}})
            assert after["result"]["content"][0]["text"] == "echo: again", after
            await wait_until(lambda: not zombies(pid) and len(descendants(pid)) == 1)
            assert open_fds(pid) == fds_before
        children = descendants(pid)
        assert proxy.stop() == 0
    assert not any(alive(child) for child in children)


async def legacy_session(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    init = jsonrpc.request(
        1,
        "initialize",
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "killer", "version": "1"}},
    )
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with http.post(url, data=json.dumps(init), headers=headers) as response:
        assert response.status == 200, await response.text()
        session = {
            **headers,
            "Mcp-Session-Id": response.headers["Mcp-Session-Id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
    async with http.post(
        url, data=json.dumps(jsonrpc.notification("notifications/initialized")), headers=session
    ) as response:
        assert response.status == 202
    return session


async def legacy_call(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    request_id: int,
    name: str,
    arguments: dict[str, Any],
) -> dict[str, Any]:
    body = jsonrpc.request(request_id, "tools/call", {"name": name, "arguments": arguments})
    async with http.post(url, data=json.dumps(body), headers=headers) as response:
        text = await response.text()
    frames = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    frames = frames or [json.loads(text)]
    return next(f for f in frames if f.get("id") == request_id)


async def test_killing_the_shared_modern_stdio_server_fails_calls_in_flight_and_it_is_restarted(logs_dir: Path) -> None:
    with serving(
        proxy_argv(stdio_command(peers.mcp2_python(), "modern_server.py")),
        logs_dir / "supervision-modern.log",
        announced=proxy_listener(),
    ) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        pid = proxy.proc.pid
        async with aiohttp.ClientSession() as http:
            headers = await legacy_session(http, url)
            warm = await legacy_call(http, url, headers, 2, "echo", {"text": "warm"})
            assert warm["result"]["content"][0]["text"] == "echo: warm"
            await wait_until(lambda: len(descendants(pid)) == 1)
            [server] = descendants(pid)
            fds_before = open_fds(pid)
            body = jsonrpc.request(
                3, "tools/call", {"name": "slow", "arguments": {"seconds": 60}, "_meta": {"progressToken": "slow"}}
            )
            progressed = asyncio.Event()
            async with http.post(url, data=json.dumps(body), headers=headers) as response:
                slow = asyncio.create_task(first_progress_then_final(response, 3, progressed))
                async with asyncio.timeout(WAIT):
                    await progressed.wait()  # the call is running in the server process
                os.kill(server, signal.SIGKILL)
                async with asyncio.timeout(WAIT):
                    failed = await slow
            assert failed["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, failed
            after = await legacy_call(http, url, headers, 4, "echo", {"text": "again"})
            assert after["result"]["content"][0]["text"] == "echo: again", after
            await wait_until(lambda: not zombies(pid) and len(descendants(pid)) == 1)
            assert descendants(pid) != {server}
            assert open_fds(pid) == fds_before
        children = descendants(pid)
        assert proxy.stop() == 0
    assert not any(alive(child) for child in children)
