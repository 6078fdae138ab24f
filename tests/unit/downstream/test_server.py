"""The server's direct routes (proxy/downstream/server.py): a request naming a plain route is served
by its handler without the router, exactly as the router would have served it, and everything else
still goes through the application's dispatch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.web_urldispatcher import UrlDispatcher

from proxy.config import load_settings
from proxy.downstream.server import direct_routes, runner

WAIT = aiohttp.ClientTimeout(total=10)
SEEN = web.AppKey("seen", list)


def handler(name: str) -> Any:
    async def handle(request: web.Request) -> web.Response:
        # What a handler reads of the dispatch: the application and the route that matched.
        request.app[SEEN].append((name, request.match_info.route.method, request.app is APPS[-1]))
        return web.json_response({"handler": name})

    return handle


APPS: list[web.Application] = []


def application(*, middleware: bool = False) -> web.Application:
    async def passing(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        response.headers["X-Middleware"] = "1"
        return response

    app = web.Application(middlewares=[web.middleware(passing)] if middleware else [])
    app[SEEN] = []
    app.router.add_post("/mcp", handler("post"))
    app.router.add_get("/mcp", handler("get"))
    app.router.add_route("*", "/mcp", handler("any"))
    app.router.add_route("*", "/other", handler("other-any"))
    app.router.add_get("/between", handler("between"))
    # A second resource of the same path, after one with a `*` route: the router never reaches it.
    app.router.add_post("/other", handler("other-post"))

    async def marked(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Prepared"] = request.match_info.route.method

    app.on_response_prepare.append(marked)
    APPS.append(app)
    return app


async def test_direct_routes_are_the_routers_own_answers() -> None:
    app = application()
    app.freeze()
    found = await direct_routes(app)
    # GET brings HEAD; `*` routes are left to the router; a route the router never reaches is not taken.
    expected = [("GET", "/between"), ("GET", "/mcp"), ("HEAD", "/between"), ("HEAD", "/mcp"), ("POST", "/mcp")]
    assert sorted(found) == expected
    match, handle = found[("POST", "/mcp")]
    assert match.route.method == "POST" and match.apps == (app,) and handle is match.route.handler
    assert await direct_routes(_frozen(application(middleware=True))) == {}


def _frozen(app: web.Application) -> web.Application:
    app.freeze()
    return app


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, web.Application, mock.MagicMock]]:
    """An application served by the proxy's runner on 127.0.0.1, its router's resolve counted."""
    app = application()
    settings = load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp"})
    started = runner(app, settings)
    await started.setup()
    site = web.TCPSite(started, "127.0.0.1", 0)
    await site.start()
    resolve = UrlDispatcher.resolve
    with mock.patch.object(UrlDispatcher, "resolve", autospec=True, side_effect=resolve) as counted:
        yield f"http://127.0.0.1:{started.addresses[0][1]}", app, counted
    await started.cleanup()


@pytest.mark.parametrize(
    ("method", "path", "headers", "handled", "routed"),
    [
        ("POST", "/mcp", {}, "post", False),  # the MCP call: straight to its handler
        ("GET", "/mcp", {}, "get", False),
        ("DELETE", "/mcp", {}, "any", True),  # a `*` route: the router's
        ("POST", "/mcp?x=1", {}, "post", True),  # a query string: the router's
        ("POST", "/mcp", {"Expect": "100-continue"}, "post", True),  # aiohttp's Expect handling
        ("POST", "/other", {}, "other-any", True),
    ],
)
async def test_served_as_the_router_would(
    served: tuple[str, web.Application, mock.MagicMock],
    method: str,
    path: str,
    headers: dict[str, str],
    handled: str,
    routed: bool,
) -> None:
    base, app, resolve = served
    async with aiohttp.ClientSession(timeout=WAIT) as client:
        async with client.request(method, base + path, data=b"{}", headers=headers) as response:
            assert response.status == 200
            assert (await response.json())["handler"] == handled
            # The on_response_prepare signal ran, with the match the router would have made.
            assert response.headers["X-Prepared"] == app[SEEN][-1][1]
    assert app[SEEN] == [(handled, app[SEEN][-1][1], True)]
    assert resolve.called is routed


async def test_an_application_with_middlewares_is_dispatched_as_usual() -> None:
    app = application(middleware=True)
    started = runner(app, load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp"}))
    await started.setup()
    try:
        site = web.TCPSite(started, "127.0.0.1", 0)
        await site.start()
        async with aiohttp.ClientSession(timeout=WAIT) as client:
            async with client.post(f"http://127.0.0.1:{started.addresses[0][1]}/mcp", data=b"{}") as response:
                assert response.status == 200
                assert response.headers["X-Middleware"] == "1"
    finally:
        await started.cleanup()
