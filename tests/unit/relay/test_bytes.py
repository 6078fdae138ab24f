"""A reply relayed byte for byte (proxy/relay/bytes.py): a whole body is read whether it came with
the head or arrives later, and held to the bound either way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from proxy.config import UpstreamConfig
from proxy.errors import ProxyError
from proxy.metrics import Metrics
from proxy.protocol import jsonrpc
from proxy.relay.bytes import ByteRelay
from proxy.relay.failures import UpstreamFailures
from proxy.upstream.http import HttpUpstream

BODY = json.dumps(jsonrpc.result_response(7, {"content": [{"type": "text", "text": "x" * 3000}]})).encode()
REQUEST = jsonrpc.request(7, "tools/call", {"name": "t", "arguments": {}})


@pytest.mark.parametrize("later", [False, True], ids=["with-the-head", "in-two-parts"])
@pytest.mark.parametrize("bound", [len(BODY), len(BODY) - 1], ids=["within", "over"])
async def test_a_whole_reply_is_relayed_as_it_came_however_it_arrives(
    aiohttp_server: Any, later: bool, bound: int
) -> None:
    async def reply(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()  # no Content-Length to refuse it by
        await response.prepare(request)
        if later:
            await response.write(BODY[:100])
            await asyncio.sleep(0.05)  # the rest comes after the head: read with a wait
            await response.write(BODY[100:])
        else:
            await response.write(BODY)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/mcp", reply)
    server = await aiohttp_server(app)
    config = UpstreamConfig(url=str(server.make_url("/mcp")), max_reply_bytes=bound)
    upstream = HttpUpstream(config, HttpUpstream.client_session(config))
    relay = ByteRelay(upstream, UpstreamFailures(Metrics()), 5.0)
    waited: list[int] = []
    read_body = upstream.read_body

    async def reading(response: Any) -> bytes:  # a body not all there yet is read with a wait
        waited.append(1)
        return await read_body(response)

    upstream.read_body = reading  # type: ignore[method-assign]
    try:
        forward = relay.forward("POST", jsonrpc.encode(REQUEST), {}, legacy=False, message=REQUEST)
        if bound < len(BODY):
            with pytest.raises(ProxyError) as refused:
                async with forward:
                    pass
            assert refused.value.code == jsonrpc.UPSTREAM_INVALID and "max_reply_bytes" in refused.value.message
        else:
            async with forward as relayed:
                assert (relayed.status, relayed.body, relayed.headers) == (
                    200,
                    BODY,
                    {"Content-Type": "application/json"},
                )
    finally:
        await upstream.close()
    assert bool(waited) == later
