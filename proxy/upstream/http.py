"""Streamable HTTP upstream client on one shared aiohttp ClientSession.

`exchange()` POSTs one JSON-RPC message and yields what comes back, whether the server chose a
JSON body or an SSE stream, as messages arrive. Leaving the context closes the response, which
is how a 2026-07-28 server learns that a request was cancelled.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import structlog
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .. import __version__, tracing
from ..config import UpstreamConfig
from ..protocol import jsonrpc
from ..protocol.headers import SESSION_HEADER
from ..protocol.relayed_reply import excerpt
from ..protocol.sse import Decoder
from .errors import (
    UpstreamError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamSessionGone,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from .wire import HttpReply, Target, requests_on

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)
_ERROR_BODY_LIMIT = 64 * 1024
# The redirects followed: those that keep the method and the body (RFC 9110 §15.4.8-9), as a
# server mounted at /mcp/ answers /mcp (Starlette's trailing slash). 301/302/303 would turn a
# POST into a GET without its message: answered as any other status.
FOLLOWED = frozenset((307, 308))
_MAX_REDIRECTS = 5
_REDIRECTS_LOGGED = 16  # distinct redirect targets logged, at most
_BASE_HEADERS = {"Accept": "application/json, text/event-stream", "User-Agent": f"mcp-era-proxy/{__version__}"}


def _static_headers(config: UpstreamConfig) -> tuple[CIMultiDict[str], dict[str, str]]:
    """The headers every request carries (the base ones, then `upstream.headers`, the last of any
    case winning), and the Content-Type a request with a body carries: one `upstream.headers`
    names (of any case) or JSON. A bodiless request (GET, DELETE) carries no Content-Type."""
    every = CIMultiDict(_BASE_HEADERS)
    for name, value in config.headers.items():
        every[name] = value  # replaces one of any case
    return every, {"Content-Type": every.popone("Content-Type", "application/json")}


_IDLE_CONNECTION_S = 4.0


class HttpUpstream:
    transport = "http"

    def __init__(self, config: UpstreamConfig, session: aiohttp.ClientSession) -> None:
        if config.url is None:
            raise ValueError("an HTTP upstream needs upstream.url")
        self.name = config.name
        self.url = config.url
        self._session = session
        every, self._content_type = _static_headers(config)
        self._requests = requests_on(session, every)  # written onto the session's connections
        self._target = Target(config.url)
        # upstream.url's user and password, as Basic credentials over any other Authorization (as
        # aiohttp's client sent them); None, the usual: nothing merged.
        url = URL(config.url)
        self._credentials = None
        if url.user or url.password:
            pair = f"{url.user or ''}:{url.password or ''}".encode()
            self._credentials = {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
        self.max_reply_bytes = config.max_reply_bytes
        self._origin = origin_of(config.url)
        self._redirects_logged: set[str] = set()

    @staticmethod
    def client_session(config: UpstreamConfig) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=config.max_connections,
            limit_per_host=0,
            enable_cleanup_closed=True,
            # Idle connections are dropped before the upstream drops them: servers commonly close
            # an idle keep-alive connection after 5 s (uvicorn, Node.js), and a request sent on a
            # connection the server is closing fails as a disconnect.
            keepalive_timeout=_IDLE_CONNECTION_S,
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s)
        # auto_decompress stays on; responses are never re-compressed toward the client. No cookie
        # jar: one session serves every caller, so a cookie a reply to one caller set would go with
        # every later request, whoever made it (clients' own cookies never go upstream).
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        await self._session.close()

    def unsent(self, exc: BaseException) -> UpstreamError:
        """The UpstreamError for a request that could not be sent."""
        if isinstance(exc, TimeoutError):
            return UpstreamTimeout(self.name, "did not accept the connection in time")
        if isinstance(exc, aiohttp.ClientConnectorError):
            return UpstreamUnavailable(self.name, _unreachable(exc))
        return UpstreamUnavailable(self.name, f"is unreachable ({exc.__class__.__name__}: {exc})")

    def exchange(self, message: JSONDict | None, headers: Mapping[str, str], *, method: str = "POST") -> _Exchange:
        """Send `message` (or a bodiless GET/DELETE); yield the reply, iterable over its messages."""
        return _Exchange(self, method, message, headers)

    async def send(self, message: JSONDict, headers: Mapping[str, str]) -> None:
        """POST a notification or a response; the upstream must accept it (2xx, no reply)."""
        async with self.exchange(message, headers) as replies:
            async for _ in replies:
                pass

    async def _stream_messages(self, response: HttpReply) -> AsyncGenerator[JSONDict, None]:
        decoder = Decoder()
        pending = 0  # bytes since the last whole event (to within a chunk): bounds one event
        try:
            async for chunk in response.content.iter_any():
                events = decoder.feed(chunk)
                pending = len(chunk) if events else pending + len(chunk)
                if pending > self.max_reply_bytes:
                    raise UpstreamProtocolError(self.name, f"sent an SSE event {self._over_limit}")
                for event in events:
                    if event.data.strip():
                        for message in self._decode(event.data):
                            yield message
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamUnavailable(self.name, f"dropped the stream ({exc.__class__.__name__})") from None

    async def _body_messages(self, response: HttpReply, content_type: str) -> list[JSONDict]:
        """The messages of a reply that is not a stream (none for 202/204 and empty bodies)."""
        status = response.status
        if status in (401, 403):
            body = await self._read_limited(response)
            raise UpstreamHTTPError(self.name, status, body, response.headers.get("WWW-Authenticate"))
        if status in (202, 204):
            return []
        raw = await self.read_body(response)
        if status < 300 and (not raw or raw.isspace()):  # blank (isspace copies nothing, strip would)
            return []  # e.g. 200 to a DELETE
        looks_json = raw.lstrip()[:1] in (b"{", b"[")
        if status < 300 and content_type != "application/json" and not looks_json:
            raise UpstreamProtocolError(
                self.name, f"sent a {content_type or 'untyped'} body that is not JSON-RPC: {excerpt(raw)!r}"
            )
        if content_type == "application/json" or looks_json:
            try:
                messages = self._decode(raw)
            except UpstreamProtocolError:
                if status >= 300:
                    raise UpstreamHTTPError(self.name, status, raw, None) from None
                raise
            return messages
        raise UpstreamHTTPError(self.name, status, raw, None)

    async def _read_limited(self, response: HttpReply) -> bytes:
        """The start of an error body (only quoted: the rest is not read)."""
        try:
            return await response.content.read(_ERROR_BODY_LIMIT)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamUnavailable(self.name, f"dropped the response ({exc.__class__.__name__})") from None

    def arrived_body(self, response: HttpReply) -> bytes | None:
        """`read_body`'s answer when the whole body has arrived (the usual: a small body comes with
        the head), without a coroutine; None: it has not, `read_body` waits for it. A declared
        length over the limit is refused either way, before anything is read."""
        length = response.content_length
        limit = self.max_reply_bytes
        if length is not None and length > limit:
            raise UpstreamProtocolError(self.name, f"sent a reply {self._over_limit}")
        content = response.content
        if not content.is_eof():
            return None
        try:
            raw = content.read_nowait()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamUnavailable(self.name, f"dropped the response ({exc.__class__.__name__})") from None
        if len(raw) > limit:
            raise UpstreamProtocolError(self.name, f"sent a reply {self._over_limit}")
        return raw

    async def read_body(self, response: HttpReply) -> bytes:
        """The whole body, as many reads as it takes (one read returns what has arrived so far),
        up to `upstream.max_reply_bytes`."""
        raw = self.arrived_body(response)  # it also refuses a declared length over the limit
        if raw is not None:  # a small body has all arrived with the head, taken without a wait
            return raw
        limit = self.max_reply_bytes
        content = response.content
        try:
            raw = await content.read(limit + 1)
            if not content.at_eof():
                parts, size = [raw], len(raw)
                while size <= limit and (part := await content.read(limit + 1 - size)):
                    parts.append(part)
                    size += len(part)
                raw = b"".join(parts)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamUnavailable(self.name, f"dropped the response ({exc.__class__.__name__})") from None
        if len(raw) > limit:
            raise UpstreamProtocolError(self.name, f"sent a reply {self._over_limit}")
        return raw

    @property
    def _over_limit(self) -> str:
        return f"over upstream.max_reply_bytes ({self.max_reply_bytes} bytes)"

    def _decode(self, text: str | bytes) -> list[JSONDict]:
        try:
            value = jsonrpc.decode(text)
        except jsonrpc.DecodeError:
            raise UpstreamProtocolError(self.name, f"sent a body that is not JSON: {excerpt(text)!r}") from None
        if not isinstance(value, list):  # the usual: one message
            value = [value]
        for item in value:
            if jsonrpc.kind(item) == "invalid":
                raise UpstreamProtocolError(self.name, f"sent a message that is not JSON-RPC: {excerpt(str(item))}")
        return value

    def forwarding(
        self, method: str, body: bytes | None, headers: Mapping[str, str], url: str | None = None
    ) -> Awaitable[HttpReply]:
        """The request with the static headers merged in, for the caller to await itself (a
        coroutine level fewer for every suspension of the request). A same-era pass-through
        (relay/bytes.py) streams the response bytes, then closes the response: it maps
        TimeoutError and aiohttp.ClientError with `unsent` (the UpstreamError the relays map), and
        gives a 307 or 308 to `follow`. No redirect is followed here."""
        if body:
            headers = {**self._content_type, **headers}
        if self._credentials is not None:
            headers = {**headers, **self._credentials}
        return self._requests.send(method, self._target if url is None else Target(url), body, headers)

    async def follow(
        self, response: HttpReply, method: str, body: bytes | None, headers: Mapping[str, str]
    ) -> HttpReply:
        """The answer at the end of the redirects (307, 308) `response` starts, each to the
        upstream's own origin; one to another origin is refused before anything is sent there:
        every request carries upstream.headers and the caller's message (aiohttp would drop only
        Authorization and Cookie). A redirect without a Location is answered as any status."""
        for _ in range(_MAX_REDIRECTS):
            location = response.headers.get("Location")
            if location is None:
                return response
            response.close()
            target = urljoin(response.url, location)
            if origin_of(target) != self._origin:
                raise UpstreamUnavailable(
                    self.name,
                    f"redirected the request to {target}, on another origin, where the proxy does not follow "
                    "it (upstream.headers and the caller's message would go there); if the server is there, "
                    "set upstream.url to it",
                )
            if target not in self._redirects_logged and len(self._redirects_logged) < _REDIRECTS_LOGGED:
                self._redirects_logged.add(target)
                log.warning(
                    "upstream_redirected", upstream=self.name, status=response.status, path=urlsplit(target).path
                )
            try:
                response = await self.forwarding(method, body, headers, target)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise self.unsent(exc) from None
            if response.status not in FOLLOWED:
                return response
        response.close()
        raise UpstreamProtocolError(self.name, f"redirected the request more than {_MAX_REDIRECTS} times")


def origin_of(url: str) -> tuple[str, str, int | None]:
    """A URL's origin (scheme, host, port; the scheme's port when none is given), in lower case:
    what a URL the upstream names must share with the configured one before anything goes there."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a port out of range
        port = -1
    return scheme, (parts.hostname or "").lower(), port


def _unreachable(exc: aiohttp.ClientConnectorError) -> str:
    """Where the connection failed and why: aiohttp's own text names the TLS context instead
    ("Cannot connect to host h:p ssl:default [Connect call failed ...]"), even for http URLs."""
    error = exc.os_error
    if isinstance(error, ssl.SSLError | socket.gaierror) or not error.errno or error.errno < 0:
        reason = error.strerror or str(error) or error.__class__.__name__
    else:
        reason = os.strerror(error.errno)  # "Connection refused", not asyncio's "Connect call failed"
    return f"is unreachable at {exc.host}:{exc.port} ({reason})"


def _media_type(content_type: str) -> str:
    """A Content-Type's media type, lower case, without parameters."""
    return content_type.split(";")[0].strip().lower()


class _Exchange:
    """`HttpUpstream.exchange`: entering sends the request and gives this same object as the reply
    (status, headers, and its messages as they arrive); leaving closes the response. One object
    for the whole exchange, a class rather than a generator: it runs once per upstream request.
    A whole (not streamed) body is read on first use, and iterated here as a plain iterator: an
    async generator the event loop would track and finalize for every request; an SSE stream is
    one (HttpUpstream._stream_messages), closed on leaving."""

    __slots__ = (
        "_content_type",
        "_headers",
        "_message",
        "_messages",
        "_method",
        "_response",
        "_span",
        "_stream",
        "_upstream",
        "headers",
        "status",
    )

    status: int
    headers: CIMultiDictProxy[str]
    _response: HttpReply  # set on entering, as are the two above

    def __init__(
        self, upstream: HttpUpstream, method: str, message: JSONDict | None, headers: Mapping[str, str]
    ) -> None:
        self._upstream = upstream
        self._method = method
        self._message = message
        self._headers = headers
        self._stream: AsyncGenerator[JSONDict, None] | None = None
        self._messages: list[JSONDict] | None = None  # a whole body's, once read (reversed: popped)

    async def __aenter__(self) -> _Exchange:
        upstream, message, headers, method = self._upstream, self._message, self._headers, self._method
        span = self._span = tracing.upstream(message, "http", method)
        traced = span is not tracing.NULL_UPSTREAM  # with the no-op span none of its calls are made
        if traced:  # the trace context sent upstream is this span's
            message, headers = span.message(message), span.headers(headers)
        try:
            body = None if message is None else jsonrpc.encode(message)
            try:
                response = self._response = await upstream.forwarding(method, body, headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise upstream.unsent(exc) from None
            if response.status in FOLLOWED:
                response = self._response = await upstream.follow(response, method, body, headers)
            status = self.status = response.status
            if traced:
                span.status(status)
            if status == 404 and SESSION_HEADER in headers:
                response.close()
                raise UpstreamSessionGone(upstream.name, "no longer knows the session (HTTP 404)")
        except BaseException as exc:
            span.end(exc)  # __aexit__ does not run
            raise
        response_headers = self.headers = response.headers
        content_type = response_headers.get("Content-Type", "")
        if content_type != "application/json":  # the usual, already a bare media type in lower case
            content_type = _media_type(content_type)
            if content_type == "text/event-stream" and status < 300:
                self._stream = upstream._stream_messages(response)
        self._content_type = content_type
        return self

    def __aiter__(self) -> AsyncIterator[JSONDict]:
        return self if self._stream is None else self._stream

    async def __anext__(self) -> JSONDict:
        messages = self._messages
        if messages is None:
            upstream = self._upstream
            if self.status == 200 and self._content_type == "application/json":
                # The usual reply, as _body_messages reads it, with one read and one decode.
                raw = upstream.arrived_body(self._response)
                if raw is None:
                    raw = await upstream.read_body(self._response)
                messages = [] if not raw or raw.isspace() else upstream._decode(raw)
            else:
                messages = await upstream._body_messages(self._response, self._content_type)
            messages.reverse()  # popped from the end, in order
            self._messages = messages
        if not messages:
            raise StopAsyncIteration
        return messages.pop()

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        # Closed here, not left to the event loop's finalizer: a reader that stops at the reply
        # leaves the generator suspended, and finalizing it would cost a task per request.
        try:
            if self._stream is not None:
                await self._stream.aclose()
            self._response.close()
        finally:
            span = self._span
            if span is not tracing.NULL_UPSTREAM:
                span.end(exc)


__all__ = ["FOLLOWED", "HttpReply", "HttpUpstream", "UpstreamError", "origin_of"]
