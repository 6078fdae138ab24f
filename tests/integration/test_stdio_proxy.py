"""The proxy in front of a stdio server it starts itself, driven over HTTP: a command that cannot be
started, and the bounds on the server processes legacy sessions hold (proxy/relay/legacy_stdio.py,
proxy/relay/legacy_sessions.py; README §stdio upstreams).

The server is tests/support/stdio_server.py, run with this interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.app import create_app
from proxy.config import load_settings
from proxy.protocol import jsonrpc
from tests.support.legacy_peer import ACCEPT, PATH, initialize_message, read_reply
from tests.support.modern_peer import ModernPeer

from .conftest import serve

SERVER = Path(__file__).resolve().parents[1] / "support" / "stdio_server.py"
NAME = "scripted-stdio"

MakeProxy = Callable[..., Awaitable[Any]]


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any) -> MakeProxy:
    """`await make_proxy(command, **settings)`: the proxy, served, starting `command` over stdio."""

    async def build(command: list[str], **overrides: Any) -> Any:
        settings = load_settings(
            None,
            **{"upstream.command": command, "upstream.name": NAME, "cache.watch": False, **overrides},
        )
        app, admin = create_app(settings)
        assert admin is None
        return await aiohttp_client(await serve(aiohttp_server, app))

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


@pytest.mark.parametrize("era", ["auto", "legacy", "modern"])
async def test_a_missing_command_is_upstream_unavailable_naming_it_and_works_once_it_exists(
    make_proxy: MakeProxy, tmp_path: Path, era: str
):
    command = tmp_path / "mcp-server"
    server_era = "legacy" if era == "auto" else era
    client = await make_proxy(
        [str(command), "--stdio"],
        **{"upstream.era": era, "upstream.env": {"STDIO_SERVER_ERA": server_era}, "upstream.probe_timeout_s": 2.0},
    )
    status, reply = await legacy_initialize(client)
    assert status == 200, reply
    assert reply["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    # argv[0] and the OS's reason, whatever the event loop puts in its exception (uvloop: no name)
    assert reply["error"]["message"] == f"upstream {NAME!r} could not start {str(command)!r}: No such file or directory"
    modern = await ModernPeer(client).request("tools/call", {"name": "pid", "arguments": {}})
    assert modern.status == 200
    assert modern.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert modern.error["message"] == reply["error"]["message"]

    write_server(command)  # the command appears: served from the next request on, no restart
    if server_era == "legacy":
        status, reply = await legacy_initialize(client)
        assert status == 200 and "result" in reply, reply
    modern = await ModernPeer(client).request("tools/call", {"name": "pid", "arguments": {}})
    assert modern.status == 200
    pid = int(modern.result["content"][0]["text"])
    assert pid > 0 and pid != os.getpid()
