"""An HTTP upstream's requests, written straight onto a connection of aiohttp's pool.

`ClientSession.request` builds a request object, a payload, a writer and a response object for
every request: about 2 000 bytecodes of Python, a quarter of a translated `tools/call`'s whole work
in the proxy. The proxy's requests are always the same shape (a method, a path, a few headers and
a body already in bytes), so here the head is written in one piece and the reply is read by the
connection's own protocol. What a client is hard to get right stays aiohttp's: the connection pool
and its limits, keep-alive and idle expiry, TLS, connect timeouts, and the response parser (in C)
with its body stream, decompression and errors (`ClientPayloadError`, `ServerDisconnectedError`).

What this leaves out on purpose: cookies (the proxy's client keeps none), redirects (the caller
follows 307/308 on the upstream's own origin, `HttpUpstream.follow`), proxies from the environment
(`trust_env` is off), `Expect: 100-continue` and the session's trace configs and middlewares.

The parts of aiohttp's client below its public API are named in `seams/aiohttp_internals.py`. Where
the installed aiohttp lacks their shape, `requests_on` gives `SessionRequests` instead: the same
requests through `ClientSession.request`, aiohttp's public API, at its cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import aiohttp
import structlog
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ..seams.aiohttp_internals import (
    Connection,
    HttpProcessingError,
    ResponseHandler,
    client_problems,
    connect,
    expect_reply,
    key_request,
    read_head,
    unparsable_reply,
)

log = structlog.get_logger(__name__)

# Sent unless a request names them: aiohttp's own automatic headers, so an upstream sees the same
# request it saw from ClientSession (the parser decompresses what it is sent).
_ACCEPT_ENCODING = "gzip, deflate"
_RETRIED = frozenset(("GET", "DELETE"))  # as aiohttp: an idempotent request retried once on a stale connection


def _defaults(every: Mapping[str, str]) -> CIMultiDict[str]:
    """What every request carries unless it names it: `every`, and aiohttp's Accept-Encoding
    where `every` names none (of any case)."""
    defaults = CIMultiDict(every)
    defaults.setdefault("Accept-Encoding", _ACCEPT_ENCODING)
    return defaults


class Target:
    """Where requests go: the request-target and Host of a URL, and the request aiohttp's connector
    keys its pool by (scheme, host, port, TLS), made once."""

    __slots__ = ("_key_request", "host", "path", "url")

    def __init__(self, url: str) -> None:
        parsed = URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.path = parsed.raw_path_qs or "/"
        self.host = parsed.host_port_subcomponent or ""  # set: an absolute URL with a host
        self._key_request: aiohttp.ClientRequest | None = None

    def key_request(self) -> aiohttp.ClientRequest:
        """The request the connector is asked for a connection with (it reads only its origin and
        TLS settings); made on first use, inside the running loop it needs."""
        request = self._key_request
        if request is None:
            request = self._key_request = key_request(self.url)
        return request


class HttpReply(Protocol):
    """An upstream's reply, as the proxy reads it: status, headers, the body stream (`content`, an
    aiohttp StreamReader), the URL answered, and `close`, which closes the connection unless the
    body was read to its end."""

    status: int
    headers: CIMultiDictProxy[str]
    content: aiohttp.StreamReader
    url: str

    @property
    def content_length(self) -> int | None: ...

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class PooledReply:
    """An upstream's reply, with the part of `aiohttp.ClientResponse` the proxy reads: status,
    headers, the body stream (`content`, an aiohttp StreamReader) and `close`. The connection goes
    back to the pool when the body has been read to its end; closing before that closes the
    connection, which is how a 2026-07-28 server learns that its request was cancelled."""

    __slots__ = ("_connection", "content", "headers", "status", "url")

    def __init__(
        self,
        status: int,
        headers: CIMultiDictProxy[str],
        content: aiohttp.StreamReader,
        url: str,
        connection: Connection,
    ) -> None:
        self.status = status
        self.headers = headers
        self.content = content
        self.url = url
        self._connection: Connection | None = connection
        content.on_eof(self._ended)  # called at once when the body came whole with the head

    @property
    def content_length(self) -> int | None:
        length = self.headers.get("Content-Length")
        return int(length) if length is not None and length.isdigit() else None

    @property
    def closed(self) -> bool:
        return self._connection is None

    def _ended(self) -> None:
        connection = self._connection
        if connection is not None:
            self._connection = None
            connection.release()  # back to the pool, unless the protocol says it must close

    def close(self) -> None:
        """Done with the reply: a body not read to its end closes the connection (and wakes a
        reader of it with ClientConnectionError, as aiohttp's own response does)."""
        connection = self._connection
        if connection is None:
            return
        self._connection = None
        content = self.content
        if not content.is_eof():
            content.set_exception(aiohttp.ClientConnectionError("Connection closed"))
        connection.close()


class Requests:
    """Sends requests on `session`'s connector, within its timeout, each with the `every` headers
    it does not name itself. The session stays the owner of the connections (closing it closes
    them); its own default headers are not sent."""

    __slots__ = ("_connector", "_default_lines", "_default_names", "_defaults", "_timeout")

    def __init__(self, session: aiohttp.ClientSession, every: Mapping[str, str]) -> None:
        connector = session.connector
        if connector is None:
            raise ValueError("the client session has no connector")
        self._connector = connector
        self._timeout = session.timeout
        defaults = _defaults(every)
        self._defaults = tuple(defaults.items())
        self._default_names = frozenset(name.lower() for name in defaults)
        self._default_lines = "".join(f"{name}: {value}\r\n" for name, value in defaults.items())

    def head(self, method: str, target: Target, body: bytes | None, headers: Mapping[str, str]) -> bytes:
        """The request's head: the request line, Host, the request's headers, then the defaults it
        does not name (a request's header replaces a default of the same name, of any case).
        Written in C calls, not a loop: it runs for every request."""
        block = "\r\n".join(map(": ".join, headers.items()))
        lines = len(headers)
        if lines and (block.count("\n") >= lines or block.count("\r") >= lines):
            # as aiohttp refuses one: a header must not end the head early (request splitting)
            raise ValueError("a line break in a header")
        if self._default_names.isdisjoint(map(str.lower, headers)):
            defaults = self._default_lines
        else:
            named = set(map(str.lower, headers))
            defaults = "".join(f"{name}: {value}\r\n" for name, value in self._defaults if name.lower() not in named)
        if body is not None:
            length = f"Content-Length: {len(body)}\r\n"
        else:  # as aiohttp: a bodiless request says so, but for a GET
            length = "" if method == "GET" else "Content-Length: 0\r\n"
        start = f"{method} {target.path} HTTP/1.1\r\nHost: {target.host}\r\n"
        separator = "\r\n" if lines else ""
        # A client's header value holds its bytes that are not UTF-8 as aiohttp's server read them
        # (surrogate escapes): they go upstream as the client sent them, not dropped or refused.
        return f"{start}{block}{separator}{defaults}{length}\r\n".encode("utf-8", "surrogateescape")

    async def send(self, method: str, target: Target, body: bytes | None, headers: Mapping[str, str]) -> PooledReply:
        """Send the request and wait for the head of its reply (informational replies passed
        over). Raises what ClientSession.request would: TimeoutError for the connection, aiohttp's
        ClientError otherwise. One coroutine, no helper: each level is resumed on every suspension."""
        head = self.head(method, target, body, headers)
        retries = 1 if method in _RETRIED else 0
        while True:
            connection = await connect(self._connector, target.key_request(), self._timeout)
            try:
                protocol: ResponseHandler | None = connection.protocol
                transport = connection.transport
                if protocol is None or transport is None or transport.is_closing():
                    raise aiohttp.ServerDisconnectedError()
                expect_reply(protocol)
                if body:
                    transport.writelines((head, body))  # one write of both (the loop gathers them)
                else:
                    transport.write(head)
                while True:
                    try:
                        message, payload = await read_head(protocol)
                    except HttpProcessingError as exc:
                        raise unparsable_reply(exc) from exc
                    code = message.code
                    if not 100 <= code < 200 or code == 101:
                        return PooledReply(code, message.headers, payload, target.url, connection)
            except BaseException as exc:
                connection.close()
                if not retries or not isinstance(exc, aiohttp.ClientOSError | aiohttp.ServerDisconnectedError):
                    raise
                retries -= 1


class SessionReply:
    """A reply of `SessionRequests`: an HttpReply over aiohttp's ClientResponse."""

    __slots__ = ("_response", "content", "headers", "status", "url")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers = response.headers
        self.content = response.content
        self.url = str(response.url)

    @property
    def content_length(self) -> int | None:
        return self._response.content_length

    @property
    def closed(self) -> bool:
        return self._response.connection is None

    def close(self) -> None:
        self._response.close()


# ClientSession's own automatic headers that `SessionRequests` leaves to its callers, as `Requests`
# does: they send Accept, User-Agent and a body's Content-Type themselves.
_LEFT_TO_CALLERS = frozenset(("Accept", "User-Agent", "Content-Type"))


class SessionRequests:
    """`Requests` through `ClientSession.request`, aiohttp's public API: used where the installed
    aiohttp lacks the shape `Requests` relies on. The same headers go out (the session's own
    default headers aside); it costs what ClientSession costs per request."""

    __slots__ = ("_defaults", "_session")

    def __init__(self, session: aiohttp.ClientSession, every: Mapping[str, str]) -> None:
        self._session = session
        self._defaults = _defaults(every)

    async def send(self, method: str, target: Target, body: bytes | None, headers: Mapping[str, str]) -> SessionReply:
        if any("\r" in line or "\n" in line for header in headers.items() for line in header):
            raise ValueError("a line break in a header")  # as Requests says it (aiohttp would too)
        merged = self._defaults.copy()
        merged.update(headers)  # a request's header replaces a default of the same name, of any case
        response = await self._session.request(
            method, target.url, data=body, headers=merged, allow_redirects=False, skip_auto_headers=_LEFT_TO_CALLERS
        )
        return SessionReply(response)


def requests_on(session: aiohttp.ClientSession, every: Mapping[str, str]) -> Requests | SessionRequests:
    """The upstream's requests on `session`'s connections: written onto them (`Requests`) where the
    installed aiohttp has the shape that relies on, through ClientSession.request otherwise (said
    once, as `dependency_fallback`)."""
    problems = client_problems()
    if not problems:
        return Requests(session, every)
    log.warning(
        "dependency_fallback",
        dependency="aiohttp",
        version=aiohttp.__version__,
        part="upstream requests",
        instead="ClientSession.request",
        missing=problems,
    )
    return SessionRequests(session, every)


__all__ = ["HttpReply", "PooledReply", "Requests", "SessionReply", "SessionRequests", "Target", "requests_on"]
