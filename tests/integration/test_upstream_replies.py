"""What the proxy does with upstream replies that are broken, invalid or merely unusual, on the
paths that relay them byte for byte (modern client and modern upstream; legacy client and legacy
upstream, in the upstream's own session) and on the translated ones."""

from __future__ import annotations

import asyncio
import json

from proxy.protocol import jsonrpc
from tests.integration.conftest import MakeProxy, Proxy, closed_port_url
from tests.support.fake_modern import Call, FakeModern, Outcome, Reply, complete
from tests.support.legacy_peer import ACCEPT, initialize_message
from tests.support.modern_peer import ModernPeer, read_reply

WAIT = 5.0  # upper bound for anything a test waits for


# ---------------------------------------------------------------------------- 2. whole replies are read whole


async def test_a_reply_over_64_kib_through_a_modern_upstream_reaches_the_legacy_client(
    proxy: Proxy, fake: FakeModern
) -> None:
    """A prompts/get with a 70 000-character argument, echoed: the reply was read in one 64 KiB
    read and refused as not JSON."""
    argument = "a" * 70_000

    async def echo(call: Call) -> Outcome:
        text = call.params["arguments"]["text"]
        return complete(messages=[{"role": "user", "content": {"type": "text", "text": text}}])

    fake.handlers["prompts/get"] = echo
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("prompts/get", {"name": "echo", "arguments": {"text": argument}})
    assert reply.result["messages"][0]["content"]["text"] == argument


async def test_a_reply_over_the_configured_bound_is_upstream_invalid_naming_the_bound(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    proxy = await make_proxy(**{"upstream.max_reply_bytes": 10_000})

    async def big(call: Call) -> Outcome:
        return complete(messages=[{"role": "user", "content": {"type": "text", "text": "b" * 20_000}}])

    fake.handlers["prompts/get"] = big
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("prompts/get", {"name": "big"})
    assert reply.error["code"] == jsonrpc.UPSTREAM_INVALID
    assert "upstream.max_reply_bytes" in reply.error["message"] and "10000" in reply.error["message"]


# ---------------------------------------------------------------------------- 3. error pages are quoted short


HTML_PAGE = (
    b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title><style>body{font:14px sans-serif}</style>"
    b"</head><body><h1>Bad Gateway</h1><p>The upstream server is unavailable."
    + b" Please try again later." * 200
    + b"</p></body></html>"
)


async def test_a_translated_request_quotes_an_html_error_page_by_its_title(proxy: Proxy, fake: FakeModern) -> None:
    """The message quoted the first 200 characters of the page's markup."""

    async def bad_gateway(call: Call) -> Outcome:
        return Reply(502, HTML_PAGE, "text/html")

    fake.handlers["tools/call"] = bad_gateway
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("tools/call", {"name": "x", "arguments": {}})
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert reply.error["message"] == "upstream 'fake-modern-upstream' answered HTTP 502: 502 Bad Gateway"


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
