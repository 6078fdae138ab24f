"""The proxy in front of a 2024-11-05 HTTP+SSE server (upstream.sse_url; proxy/upstream/sse.py):
legacy clients get an SSE connection per session, modern clients are translated on pooled ones;
the endpoint event, its origin, the bounds, a stream that ends mid-call, the headers.

The server is tests/support/sse_server.py, served on loopback by aiohttp.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from proxy.app import CONNECTION_SESSIONS, METRICS, create_app, detect_sse_upstream
from proxy.config import load_settings
from proxy.metrics import PREFIX
from proxy.protocol import jsonrpc
from proxy.upstream.errors import UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.sse import SseConnector
from proxy.upstream.stdio import StdioChannel, use_credentials, with_headers
from tests.support.legacy_client import LegacyClient, error_body, initialize_message, read_reply
from tests.support.mcp_client import ACCEPT, PATH, SseReader
from tests.support.modern_client import ModernClient
from tests.support.sse_server import FakeSseServer

from .conftest import serve

NAME = "scripted-sse"
WAIT = 10.0
JSONDict = dict[str, Any]


@dataclass
class Proxy:
    app: web.Application
    client: TestClient
    upstream: FakeSseServer

    async def connect(self, **options: Any) -> LegacyClient:
        return await LegacyClient.connect(self.client, **options)

    def connections(self) -> float:
        sample = self.app[METRICS].registry.get_sample_value(f"{PREFIX}upstream_sse_sessions", {"upstream": NAME})
        return sample or 0.0


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any) -> MakeProxy:
    async def build(upstream: FakeSseServer | None = None, **overrides: Any) -> Proxy:
        upstream = upstream or FakeSseServer()
        server = await aiohttp_server(upstream.app())
        settings = load_settings(
            None,
            **{
                "upstream.sse_url": str(server.make_url("/sse")),
                "upstream.name": NAME,
                "cache.watch": False,
                **overrides,
            },
        )
        app, _ = create_app(settings)
        return Proxy(app, await aiohttp_client(await serve(aiohttp_server, app)), upstream)

    return build


def text_of(result: dict[str, Any]) -> str:
    return result["content"][0]["text"]


# ---------------------------------------------------------------- legacy clients


async def test_a_legacy_clients_session_is_one_sse_connection_its_messages_relayed(make_proxy: MakeProxy):
    proxy = await make_proxy()
    first, second = await proxy.connect(), await proxy.connect()
    assert first.version == "2025-11-25"  # the client's own revision: relayed, not translated
    assert first.initialize_result["serverInfo"]["name"] == "scripted-sse-server"
    one = text_of((await first.request("tools/call", {"name": "sid", "arguments": {}})).result)
    two = text_of((await second.request("tools/call", {"name": "sid", "arguments": {}})).result)
    assert one != two
    assert text_of((await first.request("tools/call", {"name": "sid", "arguments": {}})).result) == one
    echoed = await first.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert text_of(echoed.result) == "hi"
    assert proxy.upstream.opened == 2 and proxy.connections() == 2
    methods = [m.get("method") for m in proxy.upstream.received]
    assert methods.count("notifications/initialized") == 2


async def test_progress_arrives_on_the_calls_stream_and_a_cancel_reaches_the_server(make_proxy: MakeProxy):
    proxy = await make_proxy()
    peer = await proxy.connect()
    held_id, held = await peer.send("tools/call", {"name": "hold", "arguments": {}, "_meta": {"progressToken": "t"}})
    async with asyncio.timeout(WAIT):
        progress = await SseReader(held).message()
    assert progress is not None and progress["method"] == "notifications/progress"
    assert progress["params"]["progressToken"] == "t"
    assert await peer.notify("notifications/cancelled", {"requestId": held_id}) == 202
    async with asyncio.timeout(WAIT):
        assert await SseReader(held).message() is None
        while not any(m.get("method") == "notifications/cancelled" for m in proxy.upstream.received):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_server_request_reaches_the_legacy_client_and_its_answer_the_server(make_proxy: MakeProxy):
    proxy = await make_proxy()
    peer = await proxy.connect(capabilities={"sampling": {}})
    call_id, call = await peer.send("tools/call", {"name": "ask", "arguments": {}})
    reader = SseReader(call)
    async with asyncio.timeout(WAIT):
        asked = await reader.message()
        assert asked is not None and asked["method"] == "sampling/createMessage"
        assert await peer.respond(asked["id"], {"role": "assistant", "content": {"type": "text", "text": "ok"}}) == 202
        final = await reader.message()
    assert final is not None and final["id"] == call_id
    assert json.loads(text_of(final["result"]))["content"]["text"] == "ok"


async def test_the_stream_ending_mid_call_fails_the_call_at_once_and_ends_the_session(make_proxy: MakeProxy):
    proxy = await make_proxy()
    peer = await proxy.connect()
    with capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            reply = await peer.request("tools/call", {"name": "drop", "arguments": {}})
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert reply.error["message"] == f"upstream {NAME!r} lost its SSE stream (the stream ended) during the request"
    assert any(e["event"] == "upstream_sse_closed" for e in logs)
    async with asyncio.timeout(WAIT):
        while proxy.connections():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    response = await peer.post(jsonrpc.request(peer.next_id(), "ping"))
    assert response.status == 404  # the session was the connection: the client starts a new one
    again = await proxy.connect()
    assert (await again.request("ping")).result == {}


async def test_the_clients_authorization_and_the_static_headers_go_on_the_get_and_every_post(make_proxy: MakeProxy):
    proxy = await make_proxy(**{"upstream.headers": {"X-Static": "s"}})
    peer = await proxy.connect(headers={"Authorization": "Bearer abc"})
    await peer.request("ping")
    assert {method for method, _ in proxy.upstream.seen} == {"GET", "POST"}
    for _, headers in proxy.upstream.seen:
        assert headers.get("Authorization") == "Bearer abc"
        assert headers.get("X-Static") == "s"


async def test_each_modern_callers_credentials_go_on_the_posts_of_its_pooled_connection(make_proxy: MakeProxy):
    proxy = await make_proxy()
    await ModernClient(proxy.client, headers={"Authorization": "Bearer m1"}).request("tools/list")
    assert proxy.upstream.seen[-1][1]["Authorization"] == "Bearer m1"
    await ModernClient(proxy.client, headers={"Authorization": "Bearer m2"}).request("tools/call", {"name": "echo"})
    assert proxy.upstream.seen[-1][1]["Authorization"] == "Bearer m2"


async def test_at_the_session_bound_with_every_connection_busy_a_new_session_gets_503(make_proxy: MakeProxy):
    proxy = await make_proxy(**{"upstream.sse.max_sessions": 1})
    busy = await proxy.connect()
    _, held = await busy.send("tools/call", {"name": "hold", "arguments": {}, "_meta": {"progressToken": "h"}})
    async with asyncio.timeout(WAIT):
        assert await SseReader(held).message() is not None
    response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
    assert response.status == 503
    assert (await error_body(response))["code"] == jsonrpc.LIMIT_EXCEEDED
    assert proxy.upstream.opened == 1 and proxy.connections() == 1
    held.close()


async def test_at_the_session_bound_an_idle_session_makes_room(make_proxy: MakeProxy):
    proxy = await make_proxy(**{"upstream.sse.max_sessions": 1})
    first = await proxy.connect()
    second = await proxy.connect()
    assert (await second.request("ping")).result == {}
    assert proxy.upstream.live() == 1 and proxy.connections() == 1
    assert (await first.post(jsonrpc.request(first.next_id(), "ping"))).status == 404


async def legacy_initialize(client: TestClient) -> dict[str, Any]:
    response = await client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
    reply = await read_reply(response, None, "initialize", 0)
    assert response.status == 200 and reply.final is not None
    return reply.final


async def test_an_sse_get_refused_with_401_reaches_clients_of_both_eras_with_its_challenge(make_proxy: MakeProxy):
    proxy = await make_proxy(FakeSseServer(token="t"))
    response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer ")
    modern = await ModernClient(proxy.client).request("tools/list")
    assert modern.status == 401
    peer = await proxy.connect(headers={"Authorization": "Bearer t"})
    assert (await peer.request("ping")).result == {}
    listed = await ModernClient(proxy.client, headers={"Authorization": "Bearer t"}).request("tools/list")
    assert listed.result["tools"]


async def test_a_redirected_sse_get_is_not_followed_and_the_error_names_where_it_pointed(
    make_proxy: MakeProxy, aiohttp_server: Any
):
    """Its GET and POSTs carry upstream.headers and the client's credentials: nothing goes to a URL
    the operator did not name (aiohttp would follow to any host, dropping only Authorization)."""
    target = FakeSseServer()
    elsewhere = await aiohttp_server(target.app())
    location = str(elsewhere.make_url("/sse"))

    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(location)

    app = web.Application()
    app.router.add_get("/sse", moved)
    server = await aiohttp_server(app)
    proxy = await make_proxy(
        **{"upstream.sse_url": str(server.make_url("/sse")), "upstream.headers": {"X-Api-Key": "k"}}
    )
    response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
    error = await error_body(response)
    assert error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert "HTTP 307" in error["message"] and location in error["message"], error
    assert target.seen == []


async def test_an_endpoint_on_another_origin_is_refused(make_proxy: MakeProxy):
    proxy = await make_proxy(FakeSseServer(endpoint="http://elsewhere.example/message"))
    reply = await legacy_initialize(proxy.client)
    assert reply["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert "not on the SSE URL's origin" in reply["error"]["message"]
    assert not [m for m, _ in proxy.upstream.seen if m == "POST"]
    assert proxy.connections() == 0


async def test_no_endpoint_event_within_its_timeout_is_a_timeout(make_proxy: MakeProxy):
    proxy = await make_proxy(FakeSseServer(send_endpoint=False), **{"upstream.sse.endpoint_timeout_s": 0.2})
    async with asyncio.timeout(WAIT):
        reply = await legacy_initialize(proxy.client)
    assert reply["error"]["code"] == jsonrpc.UPSTREAM_TIMEOUT
    assert "endpoint" in reply["error"]["message"]


async def test_an_unreachable_server_is_upstream_unavailable(aiohttp_server: Any, aiohttp_client: Any):
    from .conftest import closed_port_url

    settings = load_settings(None, **{"upstream.sse_url": closed_port_url() + "/sse", "upstream.name": NAME})
    app, _ = create_app(settings)
    client = await aiohttp_client(await serve(aiohttp_server, app))
    reply = await legacy_initialize(client)
    assert reply["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert app[CONNECTION_SESSIONS] is not None


# ---------------------------------------------------------------- modern clients


async def test_a_modern_client_is_translated_on_pooled_sse_sessions(make_proxy: MakeProxy):
    proxy = await make_proxy()
    peer = ModernClient(proxy.client)
    listed = await peer.request("tools/list")
    assert [tool["name"] for tool in listed.result["tools"]][:2] == ["sid", "echo"]
    echoed = await peer.request("tools/call", {"name": "echo", "arguments": {"text": "modern"}})
    assert text_of(echoed.result) == "modern"
    assert echoed.result["resultType"] == "complete"
    assert proxy.upstream.opened >= 1


async def test_a_modern_clients_call_whose_stream_ends_gets_a_json_rpc_error(make_proxy: MakeProxy):
    proxy = await make_proxy()
    peer = ModernClient(proxy.client)
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/call", {"name": "drop", "arguments": {}})
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    async with asyncio.timeout(WAIT):
        again = await peer.request("tools/call", {"name": "echo", "arguments": {"text": "after"}})
    assert text_of(again.result) == "after"


SERVER_EXTENSIONS = {"io.modelcontextprotocol/ui": {}, "com.example/units": {"units": ["metric"]}}
CLIENT_EXTENSIONS = {"com.example/trace": {"depth": {"max": 3}}}
NOTE = "notifications/com.example/trace/flushed"


def initializes(upstream: FakeSseServer) -> list[JSONDict]:
    return [m for m in upstream.received if m.get("method") == "initialize"]


async def test_extensions_cross_an_sse_upstream_for_a_modern_client(make_proxy: MakeProxy):
    """docs/translation.md §2.1 over HTTP+SSE: the server's extensions reach server/discover, the
    client's reach the initialize of the connection that serves it, and so does its notification."""
    upstream = FakeSseServer()
    upstream.capabilities = {"tools": {}, "extensions": SERVER_EXTENSIONS}
    proxy = await make_proxy(upstream)
    peer = ModernClient(proxy.client, capabilities={"extensions": CLIENT_EXTENSIONS})
    async with asyncio.timeout(WAIT):
        discovered = await peer.request("server/discover")
        note = {"jsonrpc": "2.0", "method": NOTE, "params": {"spans": 2, "_meta": peer.envelope()}}
        assert (await peer.post(note)).status == 202
    assert discovered.result["capabilities"]["extensions"] == SERVER_EXTENSIONS
    [opened] = initializes(proxy.upstream)
    assert opened["params"]["capabilities"]["extensions"] == CLIENT_EXTENSIONS
    assert [m for m in proxy.upstream.received if m.get("method") == NOTE] == [
        {"jsonrpc": "2.0", "method": NOTE, "params": {"spans": 2}}
    ]


async def test_extensions_cross_an_sse_upstream_for_a_legacy_client(make_proxy: MakeProxy):
    upstream = FakeSseServer()
    upstream.capabilities = {"tools": {}, "extensions": SERVER_EXTENSIONS}
    proxy = await make_proxy(upstream)
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(capabilities={"extensions": CLIENT_EXTENSIONS})
        assert await peer.notify(NOTE, {"spans": 2}) == 202
    assert peer.initialize_result["capabilities"]["extensions"] == SERVER_EXTENSIONS
    [opened] = initializes(proxy.upstream)
    assert opened["params"]["capabilities"]["extensions"] == CLIENT_EXTENSIONS
    # Relayed as it came, on the client's own connection (its POST accepted before the 202).
    assert [m for m in proxy.upstream.received if m.get("method") == NOTE] == [
        {"jsonrpc": "2.0", "method": NOTE, "params": {"spans": 2}}
    ]


# ---------------------------------------------------------------- the connection itself


def connector_to(url: str, session: aiohttp.ClientSession, **overrides: Any) -> SseConnector:
    """An SseConnector on `url` as the tests below make it, with `overrides`."""
    options: dict[str, Any] = {
        "static_headers": {},
        "connect_timeout_s": 2,
        "endpoint_timeout_s": 2,
        "max_event_bytes": 1024,
        "max_sessions": 2,
        **overrides,
    }
    return SseConnector(url, NAME, session, **options)


async def test_a_post_the_server_refuses_fails_the_write_and_a_404_ends_the_connection(aiohttp_server: Any):
    upstream = FakeSseServer()
    server = await aiohttp_server(upstream.app())
    async with aiohttp.ClientSession() as session:
        connector = connector_to(str(server.make_url("/sse")), session)
        channel = StdioChannel(connector, NAME)
        await channel.start()
        assert connector.open == 1
        upstream.sessions.clear()  # the server forgets the session
        with pytest.raises(UpstreamUnavailable, match="HTTP 404"):
            await channel.send(jsonrpc.request(1, "ping"))
        async with asyncio.timeout(WAIT):
            await channel.process.exited.wait()
        assert connector.open == 0 and not channel.running
        assert "a POST got HTTP 404" in (channel.process.ended or "")


async def test_refreshed_credentials_go_on_the_posts_that_follow_over_the_static_headers(aiohttp_server: Any):
    upstream = FakeSseServer()
    server = await aiohttp_server(upstream.app())
    async with aiohttp.ClientSession() as session:
        connector = connector_to(str(server.make_url("/sse")), session, static_headers={"X-Static": "s"})
        channel = StdioChannel(with_headers(connector, {"Authorization": "Bearer old"}), NAME)
        await channel.start()
        use_credentials(channel, {"Authorization": "Bearer new"})
        await channel.send(jsonrpc.notification("notifications/initialized"))
        await channel.stop(1.0)
    (get, get_headers), (post, post_headers) = upstream.seen
    assert (get, get_headers["Authorization"], get_headers["X-Static"]) == ("GET", "Bearer old", "s")
    assert (post, post_headers["Authorization"], post_headers["X-Static"]) == ("POST", "Bearer new", "s")


async def test_a_cookie_the_server_sets_goes_with_no_later_request_of_any_session(aiohttp_server: Any):
    """The connector's own client keeps no cookies: its sessions serve every caller (the same as the
    Streamable HTTP upstream's, tests/integration/test_upstream_replies.py). Named `localhost`: a
    cookie jar refuses cookies from an IP address anyway."""
    upstream = FakeSseServer()
    app = upstream.app()

    async def set_cookie(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Set-Cookie"] = f"affinity={request.method}-{len(upstream.seen)}; Path=/"

    app.on_response_prepare.append(set_cookie)
    server = await aiohttp_server(app)
    session = SseConnector.client_session(2.0)
    try:
        connector = connector_to(str(server.make_url("/sse")).replace("127.0.0.1", "localhost"), session)
        for _ in range(2):
            channel = StdioChannel(connector, NAME)
            await channel.start()
            await channel.send(jsonrpc.notification("notifications/initialized"))
            await channel.stop(1.0)
    finally:
        await session.close()
    assert [method for method, _ in upstream.seen] == ["GET", "POST", "GET", "POST"]
    assert [headers.get("Cookie") for _, headers in upstream.seen] == [None] * 4


async def test_an_event_over_the_byte_bound_ends_the_connection(aiohttp_server: Any):
    upstream = FakeSseServer()
    server = await aiohttp_server(upstream.app())
    exits: list[int | None] = []
    async with aiohttp.ClientSession() as session:
        connector = connector_to(str(server.make_url("/sse")), session, max_event_bytes=200)
        channel = StdioChannel(connector, NAME, on_exit=exits.append)
        await channel.start()
        route = channel.open_route(jsonrpc.request(1, "tools/call", {"name": "echo", "arguments": {"text": "x" * 500}}))
        await channel.send(jsonrpc.request(1, "tools/call", {"name": "echo", "arguments": {"text": "x" * 500}}))
        with capture_logs() as logs, pytest.raises(UpstreamUnavailable):
            async with asyncio.timeout(WAIT):
                async for _ in route.messages():
                    pass
        assert exits == [None]
        assert any(e["event"] == "upstream_sse_event_too_large" for e in logs)


async def test_the_session_bound_refuses_a_connection_past_it(aiohttp_server: Any):
    upstream = FakeSseServer()
    server = await aiohttp_server(upstream.app())
    async with aiohttp.ClientSession() as session:
        connector = connector_to(str(server.make_url("/sse")), session, endpoint_timeout_s=0.2, max_sessions=1)
        first = StdioChannel(connector, NAME)
        await first.start()
        with pytest.raises(UpstreamUnavailable, match="max_sessions"):
            await StdioChannel(connector, NAME).start()
        await first.stop(1.0)
        assert connector.open == 0
        upstream.send_endpoint = False
        with pytest.raises(UpstreamTimeout):
            await StdioChannel(connector, NAME).start()
        assert connector.open == 0  # a failed start gives its place back


# ---------------------------------------------------------------- detection behind upstream.url


async def streamable_http_server(aiohttp_server: Any) -> str:
    """A sessionful Streamable HTTP server's refusal of a request without a session: 400, JSON-RPC."""

    async def post(request: web.Request) -> web.Response:
        error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": "Bad Request: no session"}}
        return web.json_response(error, status=400)

    async def get(request: web.Request) -> web.Response:
        return web.Response(status=405)

    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", get)
    return str((await aiohttp_server(app)).make_url("/mcp"))


async def test_an_upstream_url_that_is_an_sse_url_is_detected_and_served_as_one(aiohttp_server: Any):
    upstream = FakeSseServer()
    url = str((await aiohttp_server(upstream.app())).make_url("/sse"))  # POST /sse: 405 (aiohttp)
    with capture_logs() as logs:
        settings = await detect_sse_upstream(load_settings(None, **{"upstream.url": url}))
    assert (settings.upstream.transport, settings.upstream.sse_url, settings.upstream.url) == ("sse", url, None)
    assert any(e["event"] == "upstream_sse_detected" for e in logs)
    assert [m for m, _ in upstream.seen] == ["GET"]  # the POST was refused before any session


@pytest.mark.parametrize(
    "overrides", [{"upstream.era": "modern"}, {"upstream.sse.detect": False}], ids=["era-modern", "detect-off"]
)
async def test_no_detection_when_the_era_is_modern_or_detection_is_off(aiohttp_server: Any, overrides: dict[str, Any]):
    upstream = FakeSseServer()
    url = str((await aiohttp_server(upstream.app())).make_url("/sse"))
    settings = load_settings(None, **{"upstream.url": url, **overrides})
    assert await detect_sse_upstream(settings) is settings
    assert upstream.seen == []


async def test_a_streamable_http_server_refusing_in_json_rpc_or_an_absent_one_stays_streamable_http(
    aiohttp_server: Any,
):
    from .conftest import closed_port_url

    for url in (await streamable_http_server(aiohttp_server), closed_port_url()):
        settings = load_settings(None, **{"upstream.url": url, "upstream.probe_timeout_s": 1})
        assert await detect_sse_upstream(settings) is settings


async def test_an_sse_stream_naming_an_endpoint_elsewhere_is_not_taken_for_an_sse_server(aiohttp_server: Any):
    upstream = FakeSseServer(endpoint="http://elsewhere.example/message")
    url = str((await aiohttp_server(upstream.app())).make_url("/sse"))
    settings = load_settings(None, **{"upstream.url": url})
    assert await detect_sse_upstream(settings) is settings
