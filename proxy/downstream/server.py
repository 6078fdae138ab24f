"""The HTTP server the endpoints run on: aiohttp's, with deadlines on reading each request.

aiohttp bounds only an idle connection (`keepalive_timeout`: no request under way, between two;
before the first only from aiohttp 3.14.4, so that one is timed here, with the same
`downstream.idle_timeout_s`). A client that sends its headers or its body a byte at a time holds its
connection, and then its handler, for as long as it likes (slowloris). So, per request:

- headers (`downstream.header_timeout_s`, from the request's first byte): past it the client gets
  408 with a JSON-RPC body and the connection is closed;
- body (`downstream.body_timeout_s`, from the end of the headers to the end of the body): past it
  reading the body fails with 408 (answered by the handler's guard, downstream/guard.py) and the
  connection is closed once that is sent.

Only reading the request is bounded: once it is in, its reply (an SSE stream, a long call) takes
as long as it takes. A timer is armed only while a request is incomplete, so a request that
arrives in one packet costs none.

Routes found before the first request: a request whose method and raw path name one of the
application's plain routes (the MCP endpoint's POST among them) goes straight to its handler,
with the match the router would have made, made once. Resolving it per request (the router's
walk, a match object, the application's dispatch) is a fixed cost of every call, about as much as
some layers of the proxy's own. Anything else (a query string, an escaped path, an `Expect`
header, middlewares) takes the application's usual dispatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import structlog
from aiohttp import StreamReader, hdrs, web
from aiohttp.web_urldispatcher import PlainResource, UrlMappingMatchInfo
from yarl import URL

from ..config import DownstreamConfig, Settings
from ..protocol import jsonrpc
from ..seams.aiohttp_internals import (
    RequestHandler,
    ServerReplacingRunner,
    queued_requests,
    request_count,
    request_in_progress,
    set_match,
)
from .guard import JsonErrors

log = structlog.get_logger(__name__)
# aiohttp's own reading of what arrived, called as a plain function: `super()` makes an object for
# every packet.
_parse = JsonErrors.data_received


class DeadlineHandler(JsonErrors):
    """aiohttp's connection handler, timing the reading of each request's headers and body (and,
    as JsonErrors, answering HTTP it cannot parse with a JSON-RPC error body).

    Reads the handler's own counters after it parsed what arrived (seams/aiohttp_internals.py): the
    requests whose headers are complete, and the body of the last one as aiohttp queued it.
    """

    __slots__ = ("_body", "_deadline", "_event_loop", "_expired", "_limits", "_unused")

    def __init__(
        self, manager: web.Server, limits: DownstreamConfig, loop: asyncio.AbstractEventLoop, **kwargs: Any
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._event_loop = loop
        self._limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # a body being received
        self._expired = False
        self._unused = True  # nothing has arrived yet

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm(self._limits.idle_timeout_s, self._unused_too_long)

    def data_received(self, data: bytes) -> None:
        if self._expired:
            return  # the connection closes: nothing more is read
        if self._unused:  # its first bytes: the idle deadline before them is met
            self._unused = False
            self._disarm()
        heads = request_count(self)
        in_body = self._body is not None
        _parse(self, data)
        if request_count(self) != heads:  # a request's headers are complete: theirs is met
            if self._deadline is not None:  # none, for a request that arrived in one packet
                self._disarm()
            messages = queued_requests(self)
            body = messages[-1][1] if messages else None
            if body is not None and not body.is_eof():  # only the last request's body may be unfinished
                self._body = body
                self._arm(self._limits.body_timeout_s, self._body_too_slow)
                body.on_eof(self._body_received)
        elif not in_body and data and self._deadline is None and not request_in_progress(self):
            # A request's first bytes. (Bytes that ended a body are not: what follows them in the
            # same packet, if anything, is timed from the next packet on.)
            self._arm(self._limits.header_timeout_s, self._headers_too_slow)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, expired: Any) -> None:
        self._deadline = self._event_loop.call_later(seconds, expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _body_received(self) -> None:
        self._body = None
        self._disarm()

    def _unused_too_long(self) -> None:
        # A connection that never sent a byte is closed as aiohttp closes one idle between two
        # requests: nothing is written, nobody asked anything.
        self._deadline = None
        self._expired = True
        self.force_close()

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if request_in_progress(self) or self.transport is None:
            # Bytes behind a request being answered (pipelined): nothing may be written now, and
            # the keep-alive timer bounds them once the reply is done.
            return
        self._expired = True
        seconds = self._limits.header_timeout_s
        log.warning("request_read_timeout", part="headers", timeout_s=seconds)
        message = f"Request Timeout: the request's headers did not arrive within {seconds:g} s"
        body = jsonrpc.encode(jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, message))
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        self.force_close()  # the transport sends what it holds, then closes

    def _body_too_slow(self) -> None:
        self._deadline = None
        body, self._body = self._body, None
        if body is None or body.is_eof():
            return
        self._expired = True
        seconds = self._limits.body_timeout_s
        log.warning("request_read_timeout", part="body", timeout_s=seconds)
        self.close()  # no further request on this connection: the rest of this body is never read
        # The handler's read fails with 408; ended here, so aiohttp does not linger for the rest.
        reason = f"Request Timeout: the request's body did not arrive within {seconds:g} s"
        body.set_exception(web.HTTPRequestTimeout(reason=reason))
        body.feed_eof()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Direct = dict[tuple[str, str], tuple[UrlMappingMatchInfo, Handler]]


async def direct_routes(app: web.Application) -> Direct:
    """(method, path) → the router's match for each plain route of a frozen `app`, as the router
    itself resolves it (so registration order, `*` routes and any resource that would come first
    decide as they do per request), with its handler. Empty when the application has middlewares:
    those run only through its own dispatch."""
    if app.middlewares:
        return {}
    found: Direct = {}
    for resource in app.router.resources():
        if not isinstance(resource, PlainResource):
            continue
        for route in resource:
            if route.method == hdrs.METH_ANY:
                continue
            # What the router reads of a request: its method and path.
            probe = SimpleNamespace(method=route.method, rel_url=URL(resource.canonical))
            try:
                match = await app.router.resolve(cast(web.Request, probe))
            except AttributeError:  # a resource that reads more of a request: left to the router
                continue
            if match.route is route and match.http_exception is None:
                match.add_app(app)
                match.freeze()
                found.setdefault((route.method, resource.canonical), (match, route.handler))
    return found


class DeadlineServer(web.Server):
    """The server aiohttp makes for an application, its connections made as DeadlineHandlers with
    the runner's `handler_settings`, its plain routes served without the router (`direct`, see the
    module's doc). Made in the running loop its connections are served on."""

    def __init__(
        self,
        made: web.Server,
        limits: DownstreamConfig,
        handler_settings: dict[str, Any],
        direct: Direct | None = None,
    ) -> None:
        super().__init__(
            self._dispatch if direct else made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **handler_settings,
        )
        self._limits = limits
        self._handler_settings = handler_settings
        self._event_loop = asyncio.get_running_loop()
        self._routed = made.request_handler
        self._direct = direct or {}

    def _dispatch(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        # A plain function: aiohttp awaits what it returns, the handler's own coroutine, so the
        # dispatch adds no coroutine level under the request's every suspension.
        direct = self._direct.get((request.method, request.raw_path))
        if direct is None or hdrs.EXPECT in request.headers:
            return self._routed(request)
        match, handler = direct
        set_match(request, match)  # as the application's dispatch would
        return handler(cast(web.Request, request))

    def __call__(self) -> RequestHandler:
        return DeadlineHandler(self, self._limits, self._event_loop, **self._handler_settings)


class Runner(ServerReplacingRunner):
    """The application's runner, serving it on a DeadlineServer: `handler_settings` are what each
    connection handler is made with (aiohttp's keyword arguments: keepalive_timeout, access_log)."""

    def __init__(
        self,
        app: web.Application,
        limits: DownstreamConfig,
        *,
        handle_signals: bool = False,
        shutdown_timeout: float = 60.0,
        handler_cancellation: bool = True,
        **handler_settings: Any,
    ) -> None:
        super().__init__(
            app,
            handle_signals=handle_signals,
            shutdown_timeout=shutdown_timeout,
            handler_cancellation=handler_cancellation,
            **handler_settings,
        )
        self._limits = limits
        self._handler_settings = handler_settings

    async def made_server(self, made: web.Server) -> web.Server:
        # the application is started and frozen
        return DeadlineServer(made, self._limits, self._handler_settings, await direct_routes(self.app))


_SHORTEST_GRACE_S = 0.01


def runner(app: web.Application, settings: Settings) -> Runner:
    """The runner of one listener (the MCP endpoint, or the admin endpoints on their own address).

    handler_cancellation: a client that disconnects cancels its handler, which closes the
    upstream request too (for a 2026-07-28 upstream that is the cancellation). shutdown_timeout:
    calls in flight at SIGTERM get this long before they are cancelled. keepalive_timeout: an
    idle connection is closed after this.
    """
    return Runner(
        app,
        settings.downstream,
        access_log=None,
        # aiohttp reads a timeout of 0 as none at all (shutdown would wait for every call): a
        # grace of 0 means "cancel at once".
        shutdown_timeout=max(settings.shutdown.grace_s, _SHORTEST_GRACE_S),
        keepalive_timeout=settings.downstream.idle_timeout_s,
    )
