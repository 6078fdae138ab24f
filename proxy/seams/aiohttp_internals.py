"""The parts of aiohttp below its public API that the proxy uses, each named here once, with a
check of the shape relied on.

Two edges go below the public API, each for a measured reason (docs/design.md §Seams):
- the upstream's requests are written onto connections of the client's pool and their replies read
  by the connection's own protocol (`upstream/wire.py`): `ClientSession.request` builds four objects
  a request that cost a quarter of a translated call;
- the HTTP server times the reading of each request from its connection handler's own counters
  (`downstream/server.py`: read deadlines against slow clients), serves its plain routes without
  the router, and serves a replica's replay as a clone carrying the replayed body
  (`cluster/replay.py`).

`client_problems()` and `server_problems()` say what of that shape the installed aiohttp lacks. The
client part has a public fallback (`upstream/wire.py` `SessionRequests`, on `ClientSession.request`);
the server part has none (the read deadlines are a defence, not an optimisation), so the proxy
refuses to start without it (`proxy/seams/supported.py`). The tests of this module check the
behaviour each name stands for on the installed version; the test command runs them on the lowest
supported aiohttp and on the newest.
"""

from __future__ import annotations

import asyncio
import inspect
import operator
import types
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

# ------------------------------------------------------------------ the client's connections

_NO_TRACES: list[Any] = []


def key_request(url: str) -> aiohttp.ClientRequest:
    """The request a connector is asked for a connection with: it reads only its origin and TLS
    settings. Made inside the running loop it needs."""
    return aiohttp.ClientRequest("GET", URL(url), loop=asyncio.get_running_loop(), ssl=True)


def connect(
    connector: aiohttp.BaseConnector, key: aiohttp.ClientRequest, timeout: aiohttp.ClientTimeout
) -> Awaitable[Connection]:
    """A connection of the pool for `key`'s origin (pooling, limits, TLS and connect timeouts are
    the connector's); a plain function: the caller awaits the connector's own coroutine."""
    return connector.connect(key, _NO_TRACES, timeout)


def expect_reply(protocol: ResponseHandler) -> None:
    """Readies the connection's parser for the next reply; a body with neither a length nor
    chunks is read to the connection's end, as ClientSession reads one."""
    protocol.set_response_params(read_until_eof=True)


def read_head(protocol: ResponseHandler) -> Awaitable[tuple[Any, aiohttp.StreamReader]]:
    """The next reply's head (status, headers) and its body stream, as the parser gives them."""
    return protocol.read()


def unparsable_reply(exc: HttpProcessingError) -> aiohttp.ClientResponseError:
    """What ClientSession raises for a reply that is not HTTP."""
    return aiohttp.ClientResponseError(_NO_REQUEST_INFO, (), status=exc.code, message=exc.message, headers=exc.headers)


_NO_REQUEST_INFO = aiohttp.RequestInfo(URL(), "", CIMultiDictProxy(CIMultiDict()), URL())


def client_problems() -> list[str]:
    """What the installed aiohttp lacks of the client shape above (empty: all there)."""
    problems: list[str] = []
    _parameters(problems, aiohttp.BaseConnector.connect, "BaseConnector.connect", ("req", "traces", "timeout"))
    _parameters(
        problems,
        getattr(ResponseHandler, "set_response_params", None),
        "ResponseHandler.set_response_params",
        ("read_until_eof",),
    )
    if not inspect.iscoroutinefunction(getattr(ResponseHandler, "read", None)):
        problems.append("ResponseHandler.read is not a coroutine function")
    _parameters(problems, aiohttp.ClientRequest.__init__, "ClientRequest", ("method", "url", "loop", "ssl"))
    for name in ("protocol", "transport", "release", "close"):
        if not hasattr(Connection, name):
            problems.append(f"Connection.{name} is missing")
    if getattr(aiohttp.RequestInfo, "_fields", None) != ("url", "method", "headers", "real_url"):
        problems.append("RequestInfo is not (url, method, headers, real_url)")
    for name in ("code", "message", "headers"):
        if name not in inspect.signature(HttpProcessingError.__init__).parameters:
            problems.append(f"HttpProcessingError takes no {name}")
    return problems


# ------------------------------------------------------------------ the server's connection handler

# A connection handler's own counters, read after it parsed what arrived: the requests whose
# headers are complete, the requests it queued for the application (message, body stream), and
# whether one is being answered.
request_count: Callable[[RequestHandler], int] = operator.attrgetter("_request_count")
queued_requests: Callable[[RequestHandler], deque[tuple[Any, aiohttp.StreamReader]]] = operator.attrgetter("_messages")
request_in_progress: Callable[[RequestHandler], bool] = operator.attrgetter("_request_in_progress")


class ServerReplacingRunner(web.AppRunner):
    """An AppRunner whose server a subclass may replace (`made_server`) once the application is
    started and frozen: the one place the runner's private server factory is overridden."""

    async def _make_server(self) -> web.Server:
        return await self.made_server(await super()._make_server())

    async def made_server(self, made: web.Server) -> web.Server:
        return made


def set_match(request: web.BaseRequest, match: web.UrlMappingMatchInfo) -> None:
    """What the application's dispatch sets on a request it routed: the match, which request.app,
    request.match_info and the on_response_prepare signals read."""
    request._match_info = match  # type: ignore[attr-defined]


def set_body(request: web.BaseRequest, body: bytes) -> None:
    """A request whose body is `body`, read already (a clone's own body, for a replay)."""
    request._read_bytes = body


def server_problems() -> list[str]:
    """What the installed aiohttp lacks of the server shape above (empty: all there)."""
    problems: list[str] = []
    for name in ("_request_count", "_messages", "_request_in_progress"):
        if not isinstance(inspect.getattr_static(RequestHandler, name, None), types.MemberDescriptorType):
            problems.append(f"RequestHandler.{name} is missing")
    for name in ("data_received", "connection_lost", "force_close", "close", "handle_error", "log_exception"):
        if not callable(getattr(RequestHandler, name, None)):
            problems.append(f"RequestHandler.{name} is missing")
    server = inspect.signature(web.Server.__init__).parameters
    for name in ("request_factory", "handler_cancellation", "loop", "kwargs"):
        if name not in server:
            problems.append(f"web.Server takes no {name}")
    made = getattr(web.AppRunner, "_make_server", None)
    if not inspect.iscoroutinefunction(made) or list(inspect.signature(made).parameters) != ["self"]:
        problems.append("AppRunner._make_server is not a coroutine function of the runner alone")
    if "_match_info" not in getattr(web.Request, "ATTRS", ()):
        problems.append("web.Request._match_info is not one of its attributes")
    if "_read_bytes" not in getattr(web.BaseRequest, "ATTRS", ()):
        problems.append("web.BaseRequest._read_bytes is not one of its attributes")
    return problems


def _parameters(problems: list[str], function: object, name: str, wanted: tuple[str, ...]) -> None:
    if not callable(function):
        problems.append(f"{name} is missing")
        return
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        problems.append(f"{name} has no signature to check")
        return
    problems.extend(f"{name} takes no {parameter}" for parameter in wanted if parameter not in parameters)


__all__ = [
    "Connection",
    "HttpProcessingError",
    "RequestHandler",
    "ResponseHandler",
    "ServerReplacingRunner",
    "client_problems",
    "connect",
    "expect_reply",
    "key_request",
    "queued_requests",
    "read_head",
    "request_count",
    "request_in_progress",
    "server_problems",
    "set_body",
    "set_match",
    "unparsable_reply",
]
