"""What the proxy does with upstream replies that are broken, invalid or merely unusual, on the
paths that relay them byte for byte (modern client and modern upstream; legacy client and legacy
upstream, in the upstream's own session) and on the translated ones."""

from __future__ import annotations

import asyncio
import json

from proxy.protocol import jsonrpc
from tests.integration.conftest import MakeProxy, closed_port_url
from tests.support.legacy_peer import ACCEPT, initialize_message
from tests.support.modern_peer import ModernPeer, read_reply

WAIT = 5.0  # upper bound for anything a test waits for


# ---------------------------------------------------------------------------- 4. unreachable


async def test_an_unreachable_upstream_is_named_by_host_and_port_not_by_tls_defaults(make_proxy: MakeProxy) -> None:
    url = closed_port_url()
    port = url.split(":")[2].split("/")[0]
    proxy = await make_proxy(upstream_url=url)
    peer = ModernPeer(proxy.client)
    async with asyncio.timeout(WAIT):
        translated = await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})
        initialize_error = json.loads(await translated.read())["error"]
        message, response = await peer.send("tools/call", {"name": "x", "arguments": {}})
        relayed = await read_reply(response, message)
    for error in (initialize_error, relayed.error):
        assert error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
        assert f"127.0.0.1:{port}" in error["message"], error
        assert "ssl" not in error["message"] and "refused" in error["message"].lower(), error
