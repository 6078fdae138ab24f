"""Legacy messages without an Mcp-Session-Id.

A legacy server MAY hand out no session id (`2025-11-25/basic/transports.mdx` §Session Management;
the SDKs' stateless mode): its client then sends everything after `initialize` without one. In front
of a legacy HTTP server the proxy relays the client's own session byte for byte, so such messages go
to the server, which decides. Where the proxy holds the sessions (a modern upstream), a legacy message
without one is refused (docs/translation.md §1.1 rung 7).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from proxy.protocol import jsonrpc
from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_LEGACY
from tests.integration.conftest import PATH, MakeProxy, serve
from tests.support.fake_legacy import initialize_result
from tests.support.legacy_client import initialize_message
from tests.support.mcp_client import ACCEPT

WAIT = 10.0
TOOLS = [{"name": "echo", "inputSchema": {"type": "object"}}]


class SessionlessServer:
    """A legacy Streamable HTTP server in stateless mode: every POST answered on its own, no id."""

    def __init__(self) -> None:
        self.posted: list[tuple[dict[str, Any], str | None]] = []  # (message, its Mcp-Session-Id)
        self.app = web.Application()
        self.app.router.add_post(PATH, self._post)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        message = json.loads(await request.read())
        self.posted.append((message, request.headers.get(SESSION_HEADER)))
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] == "initialize":
            result = initialize_result()
        elif message["method"] == "tools/list":
            result = {"tools": TOOLS}
        else:
            return web.json_response(jsonrpc.error_response(message["id"], jsonrpc.METHOD_NOT_FOUND, "nope"))
        return web.json_response(jsonrpc.result_response(message["id"], result))


HEADERS = {"Accept": ACCEPT, "Content-Type": "application/json"}


async def test_a_sessionless_legacy_server_serves_its_client_through_the_proxy(
    aiohttp_server: Any, make_proxy: MakeProxy
) -> None:
    upstream = SessionlessServer()
    server = await serve(aiohttp_server, upstream.app)
    proxy = await make_proxy(upstream_url=str(server.make_url(PATH)), **{"upstream.era": "legacy"})
    async with asyncio.timeout(WAIT):
        opened = await proxy.client.post(PATH, json=initialize_message(), headers=HEADERS)
        assert opened.status == 200 and SESSION_HEADER not in opened.headers
        assert (await opened.json())["result"]["protocolVersion"] == LATEST_LEGACY
        later = {**HEADERS, PROTOCOL_VERSION_HEADER: LATEST_LEGACY}
        initialized = jsonrpc.notification("notifications/initialized")
        assert (await proxy.client.post(PATH, json=initialized, headers=later)).status == 202
        listed = await proxy.client.post(PATH, json=jsonrpc.request(2, "tools/list"), headers=later)
        assert listed.status == 200
        assert await listed.json() == jsonrpc.result_response(2, {"tools": TOOLS})
    assert [(m.get("method"), sid) for m, sid in upstream.posted] == [
        ("initialize", None),
        ("notifications/initialized", None),
        ("tools/list", None),
    ]


async def test_a_legacy_message_without_a_session_is_refused_where_the_proxy_holds_the_sessions(
    make_proxy: MakeProxy,
) -> None:
    proxy = await make_proxy()  # a modern upstream: the proxy mints the legacy sessions
    headers = {**HEADERS, PROTOCOL_VERSION_HEADER: LATEST_LEGACY}
    async with asyncio.timeout(WAIT):
        refused = await proxy.client.post(PATH, json=jsonrpc.request(2, "tools/list"), headers=headers)
        assert refused.status == 400
        body = await refused.json()
    assert body["id"] == 2 and body["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert "no Mcp-Session-Id" in body["error"]["message"]
