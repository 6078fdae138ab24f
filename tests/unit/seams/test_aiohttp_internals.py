"""The parts of aiohttp below its public API that the proxy relies on (proxy/seams/aiohttp_internals.py):
their shape on the installed aiohttp, the behaviour each name stands for, and what the checks say when
a class lacks that shape (a patched class stands for an aiohttp the proxy does not know)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from structlog.testing import capture_logs

from proxy.config import load_settings
from proxy.seams import aiohttp_internals as seam
from proxy.upstream.http import HttpUpstream
from proxy.upstream.wire import Requests, SessionRequests

WAIT = 5.0


def test_the_installed_aiohttp_has_every_part_the_proxy_relies_on() -> None:
    assert seam.client_problems() == []
    assert seam.server_problems() == []


class Handlers(web.Server):
    """aiohttp's server, keeping the connection handlers it makes."""

    def __init__(self, handler: Any) -> None:
        super().__init__(handler)
        self.made: list[seam.RequestHandler] = []

    def __call__(self) -> seam.RequestHandler:
        made = super().__call__()
        self.made.append(made)
        return made


@pytest.fixture
async def connection() -> AsyncIterator[tuple[seam.RequestHandler, asyncio.Event, asyncio.Event]]:
    """A connection handler of aiohttp's server on one end of a socket pair, fed by the test by
    hand; its application handler waits for `release` once `entered` is set."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def answer(request: web.BaseRequest) -> web.Response:
        await request.read()
        entered.set()
        await release.wait()
        return web.Response(text="ok")

    server = Handlers(answer)
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(server, ours)
    (handler,) = server.made
    yield handler, entered, release
    release.set()
    transport.close()
    theirs.close()
    await server.shutdown(0.1)


async def test_a_handler_counts_requests_whose_headers_are_complete_and_queues_their_bodies(
    connection: tuple[seam.RequestHandler, asyncio.Event, asyncio.Event],
) -> None:
    handler, entered, release = connection
    assert seam.request_count(handler) == 0 and not seam.request_in_progress(handler)
    handler.data_received(b"POST /mcp HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n")
    assert seam.request_count(handler) == 0  # the headers are not complete yet
    handler.data_received(b"\r\nab")
    assert seam.request_count(handler) == 1
    message, body = seam.queued_requests(handler)[-1]
    assert message.method == "POST" and not body.is_eof()  # half the body has arrived
    handler.data_received(b"cd")
    assert body.is_eof()
    async with asyncio.timeout(WAIT):
        await entered.wait()
    assert seam.request_in_progress(handler)  # being answered
    release.set()


async def test_a_runner_whose_server_is_replaced_serves_on_the_replacement() -> None:
    made: list[web.Server] = []

    class Replacing(seam.ServerReplacingRunner):
        async def made_server(self, server: web.Server) -> web.Server:
            made.append(server)
            return web.Server(lambda request: _answer(request, "replaced"))

    app = web.Application()
    app.router.add_get("/", _routed)
    runner = Replacing(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as client, asyncio.timeout(WAIT):
            async with client.get(f"http://127.0.0.1:{port}/") as response:
                assert await response.text() == "replaced"
    finally:
        await runner.cleanup()
    assert len(made) == 1 and made[0].request_handler is not None  # the server aiohttp made for the app


async def _answer(request: web.BaseRequest, text: str) -> web.Response:
    return web.Response(text=text)


async def _routed(request: web.Request) -> web.Response:
    return await _answer(request, "routed")


# ------------------------------------------------------------------ a shape the proxy does not know


def test_a_connector_or_a_protocol_of_another_shape_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def set_response_params(self: ResponseHandler, *, timer: Any = None) -> None:  # no read_until_eof
        raise AssertionError("not called")

    async def connect(self: aiohttp.BaseConnector, req: Any, deadline: Any) -> Any:  # no traces, another name
        raise AssertionError("not called")

    monkeypatch.setattr(ResponseHandler, "set_response_params", set_response_params)
    monkeypatch.setattr(aiohttp.BaseConnector, "connect", connect)
    assert seam.client_problems() == [
        "BaseConnector.connect takes no traces",
        "BaseConnector.connect takes no timeout",
        "ResponseHandler.set_response_params takes no read_until_eof",
    ]


def test_a_connection_handler_without_its_counters_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(seam.RequestHandler, "_request_count")
    monkeypatch.setattr(web.AppRunner, "_make_server", lambda self, app: None)  # another signature
    monkeypatch.setattr(web.Request, "ATTRS", web.Request.ATTRS - {"_match_info"})
    assert seam.server_problems() == [
        "RequestHandler._request_count is missing",
        "AppRunner._make_server is not a coroutine function of the runner alone",
        "web.Request._match_info is not one of its attributes",
    ]


async def test_an_upstream_on_an_aiohttp_of_another_shape_sends_through_client_session(
    monkeypatch: pytest.MonkeyPatch, aiohttp_server: Any
) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"jsonrpc": "2.0", "id": (await request.json())["id"], "result": {}})

    app = web.Application()
    app.router.add_post("/mcp", answer)
    server = await aiohttp_server(app)
    config = load_settings(None, **{"upstream.url": str(server.make_url("/mcp"))}).upstream

    # Another shape (its parameters unnamed) that aiohttp's own client still works with.
    original = ResponseHandler.set_response_params

    def set_response_params(self: ResponseHandler, **kwargs: Any) -> None:
        original(self, **kwargs)

    monkeypatch.setattr(ResponseHandler, "set_response_params", set_response_params)
    with capture_logs() as logs:
        upstream = HttpUpstream(config, HttpUpstream.client_session(config))
    try:
        assert isinstance(upstream._requests, SessionRequests)
        (said,) = [entry for entry in logs if entry["event"] == "dependency_fallback"]
        assert said["dependency"] == "aiohttp" and said["instead"] == "ClientSession.request"
        assert said["missing"] == ["ResponseHandler.set_response_params takes no read_until_eof"]
        async with asyncio.timeout(WAIT):
            async with upstream.exchange({"jsonrpc": "2.0", "id": 7, "method": "ping"}, {}) as reply:
                assert [message async for message in reply] == [{"jsonrpc": "2.0", "id": 7, "result": {}}]
    finally:
        await upstream.close()
    monkeypatch.undo()
    pooled = HttpUpstream(config, HttpUpstream.client_session(config))
    try:
        assert isinstance(pooled._requests, Requests)  # the shape known: written onto the connections
    finally:
        await pooled.close()
