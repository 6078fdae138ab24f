"""A 2024-11-05 HTTP+SSE server as a message channel: one SSE connection is one legacy session.

Spec: 2024-11-05/basic/transports.mdx §HTTP with SSE. The client GETs the SSE URL; the server's
first event, `endpoint`, names the URL the client POSTs every message to (each answered 202);
every message of the server arrives as an event on the stream. The proxy treats such a connection
as it treats a stdio server process (upstream/stdio.py): `SseConnection` has the StdioProcess
interface (start, write, running, exited, stop), so StdioChannel multiplexes requests over it and
the stdio session machinery (a session per legacy client, pooled sessions for modern clients)
runs on it unchanged. A stream that ends ends the session: no reconnect (the spec's 2024-11-05
transport cannot resume one), the requests open on it fail as when a stdio server exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin

import aiohttp
import structlog

from ..protocol import jsonrpc
from ..protocol.detection import probe_request
from ..protocol.legacy_to_modern import upstream_headers
from ..protocol.sse import Decoder, Event
from ..protocol.versions import LATEST_MODERN
from .errors import UpstreamHTTPError, UpstreamTimeout, UpstreamUnavailable
from .http import origin_of
from .stdio import Tally

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_POST_TIMEOUT_S = 30.0  # a POST is only accepted (202) there: its answer comes on the stream
_POST_BODY_LIMIT = 64 * 1024  # what the proxy reads of a POST's answer ("Accepted", an error page)
_GONE = (404, 410)  # the server no longer knows the session: it is over
_ids = itertools.count(1)


class EndpointError(ValueError):
    """The `endpoint` event names no URL the proxy may POST to."""


def resolve_endpoint(sse_url: str, data: str) -> str:
    """The POST URL an `endpoint` event names, resolved against the SSE URL; only on the SSE URL's
    own origin (scheme, host, port): a server's stream must not send the session's messages, with
    the client's credentials, anywhere else."""
    target = data.strip()
    if not target:
        raise EndpointError("the endpoint event is empty")
    resolved = urljoin(sse_url, target)
    if origin_of(resolved) != origin_of(sse_url):
        raise EndpointError(f"the endpoint {target!r} is not on the SSE URL's origin")
    return resolved


class SseEvents:
    """The events of one SSE stream, bounded: an event whose bytes pass `max_event_bytes` fails."""

    def __init__(self, response: aiohttp.ClientResponse, max_event_bytes: int) -> None:
        self._chunks = response.content.iter_any()
        self._decoder = Decoder()
        self._ready: list[Event] = []
        self._pending = 0  # bytes since the last whole event (to within a chunk)
        self._max = max_event_bytes

    async def next(self) -> Event | None:
        """The next event; None when the stream ends. OverflowError for an event over the bound."""
        while not self._ready:
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                return None
            events = self._decoder.feed(chunk)
            self._pending = len(chunk) if events else self._pending + len(chunk)
            if self._pending > self._max:
                raise OverflowError(f"an SSE event over upstream.max_reply_bytes ({self._max} bytes)")
            self._ready.extend(events)
        return self._ready.pop(0)


class SseConnection:
    """One HTTP+SSE session: the GET stream the server speaks on, the POST endpoint it listens at.

    `headers`: what the GET and every POST carry (upstream.headers, the caller's credentials);
    `credentials` the caller's part, which `use_credentials` replaces for the POSTs that follow.
    """

    def __init__(
        self,
        sse_url: str,
        *,
        name: str,
        session: aiohttp.ClientSession,
        headers: Mapping[str, str],
        connect_timeout_s: float,
        endpoint_timeout_s: float,
        max_event_bytes: int,
        on_message: Callable[[JSONDict], None],
        credentials: Mapping[str, str] | None = None,
        on_exit: Callable[[int | None], None] = lambda code: None,
        tally: Tally | None = None,
        admit: Callable[[], bool] = lambda: True,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.sse_url = sse_url
        self.name = name
        self._static = dict(headers)
        self.headers = {**self._static, **(credentials or {})}
        self.endpoint: str | None = None
        self.pid = next(_ids)  # no process: a number naming the connection in the logs
        self._session = session
        self._connect_timeout_s = connect_timeout_s
        self._endpoint_timeout_s = endpoint_timeout_s
        self._max_event_bytes = max_event_bytes
        self._on_message = on_message
        self._on_exit = on_exit
        self._tally = tally
        self._admit = admit
        self._release = release
        self._admitted = False
        self._why: str | None = None  # why the proxy ended it, when the proxy did
        self.ended: str | None = None
        self._response: aiohttp.ClientResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.exited = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._reader is not None and not self.exited.is_set()

    async def start(self) -> None:
        """Open the stream and wait for its `endpoint` event; UpstreamUnavailable (or UpstreamTimeout)
        saying why when there is no session to be had."""
        if not self._admit():
            raise UpstreamUnavailable(self.name, "has as many SSE sessions open as upstream.sse.max_sessions allows")
        self._admitted = True
        try:
            events = await self._open()
            try:
                async with asyncio.timeout(self._endpoint_timeout_s):
                    self.endpoint = await self._endpoint(events)
            except TimeoutError:
                raise UpstreamTimeout(
                    self.name, f"sent no endpoint event within {self._endpoint_timeout_s:g} s"
                ) from None
        except BaseException:
            self._close_response()
            self._leave()
            raise
        if self._tally is not None:
            self._tally.inc()
        self._reader = asyncio.create_task(self._read(events), name=f"sse-{self.pid}")
        self._reader.add_done_callback(lambda task: self._finish("closed"))  # even if cancelled before it ran
        log.info("upstream_sse_connected", upstream=self.name, connection=self.pid)

    async def _open(self) -> SseEvents:
        headers = {**self.headers, "Accept": "text/event-stream", "Cache-Control": "no-cache"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s, sock_read=None)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                # No redirects, here or on the POSTs: aiohttp would follow one to any host, with
                # upstream.headers (it drops only Authorization and Cookie). A 3xx is answered below.
                response = await self._session.get(
                    self.sse_url, headers=headers, timeout=timeout, allow_redirects=False
                )
        except TimeoutError:
            raise UpstreamTimeout(self.name, "did not answer the SSE GET in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(self.name, f"is unreachable ({exc.__class__.__name__}: {exc})") from None
        self._response = response
        if response.status in (401, 403):
            # An OAuth-protected server: relayed with its challenge, so the client authenticates.
            body = await response.content.read(_POST_BODY_LIMIT)
            raise UpstreamHTTPError(self.name, response.status, body, response.headers.get("WWW-Authenticate"))
        content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if response.status != 200 or content_type != "text/event-stream":
            location = response.headers.get("Location")
            moved = (
                f", redirecting to {location} (not followed; if the server is there, set upstream.sse_url to it)"
                if location
                else ""
            )
            raise UpstreamUnavailable(
                self.name,
                f"answered the SSE GET with HTTP {response.status} ({content_type or 'no content type'}){moved}",
            )
        return SseEvents(response, self._max_event_bytes)

    async def _endpoint(self, events: SseEvents) -> str:
        while True:
            try:
                event = await events.next()
            except (aiohttp.ClientError, OverflowError) as exc:
                raise UpstreamUnavailable(self.name, f"broke the SSE stream before its endpoint ({exc})") from None
            if event is None:
                raise UpstreamUnavailable(self.name, "ended the SSE stream before sending its endpoint")
            if event.event != "endpoint":
                log.warning("upstream_sse_before_endpoint", upstream=self.name, sse_event=event.event)
                continue
            try:
                return resolve_endpoint(self.sse_url, event.data)
            except EndpointError as exc:
                raise UpstreamUnavailable(self.name, str(exc)) from None

    async def _read(self, events: SseEvents) -> None:
        reason = "the stream ended"
        try:
            while True:
                try:
                    event = await events.next()
                except OverflowError as exc:
                    reason = f"it sent {exc}"
                    log.warning("upstream_sse_event_too_large", upstream=self.name, limit=self._max_event_bytes)
                    return
                except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
                    reason = f"the stream broke: {exc.__class__.__name__}"
                    return
                if event is None:
                    return
                if event.event != "message":
                    log.debug("upstream_sse_event_ignored", upstream=self.name, sse_event=event.event)
                    continue
                if event.data.strip():
                    self._deliver(event.data)
        finally:
            self._finish(self._why or reason)

    def _finish(self, reason: str) -> None:
        """The session is over: once, whether the reader ran to its end or was cancelled unstarted."""
        if self.exited.is_set():
            return
        self._close_response()
        if self._tally is not None:
            self._tally.dec()
        self._leave()
        self.ended = f"lost its SSE stream ({reason})"  # what StdioChannel tells the requests open
        self.exited.set()
        log.info("upstream_sse_closed", upstream=self.name, connection=self.pid, reason=reason)
        self._on_exit(None)

    def _deliver(self, data: str) -> None:
        try:
            value = jsonrpc.decode(data)
        except jsonrpc.DecodeError:
            log.warning("upstream_invalid_line", upstream=self.name, line=data[:200])
            return
        for message in value if isinstance(value, list) else [value]:
            if jsonrpc.kind(message) == "invalid":
                log.warning("upstream_invalid_message", upstream=self.name, message=str(message)[:200])
                continue
            self._on_message(message)

    def use_credentials(self, credentials: Mapping[str, str]) -> None:
        """The caller's latest credentials (a refreshed token) on the POSTs from now on."""
        self.headers = {**self._static, **credentials}

    async def write(self, message: JSONDict) -> None:
        """POST one message; ConnectionError when it is not accepted (the session ends when the
        server says it no longer knows it, or cannot be reached)."""
        if not self.running or self.endpoint is None:
            raise ConnectionError(f"upstream SSE session {self.name!r} is not open")
        headers = {**self.headers, "Content-Type": "application/json"}
        async with self._write_lock:  # in order: initialized before the next request, and so on
            try:
                async with asyncio.timeout(_POST_TIMEOUT_S):
                    async with self._session.post(
                        self.endpoint, data=jsonrpc.encode(message), headers=headers, allow_redirects=False
                    ) as response:
                        status = response.status
                        body = await response.content.read(_POST_BODY_LIMIT)
            except (TimeoutError, aiohttp.ClientError) as exc:
                self._end(f"a POST failed: {exc.__class__.__name__}")
                raise ConnectionError(f"the POST failed ({exc.__class__.__name__})") from None
        if 200 <= status < 300:
            return
        if status in _GONE:
            self._end(f"a POST got HTTP {status}: the server no longer knows the session")
        text = body.decode("utf-8", "replace").strip()[:200]
        raise ConnectionError(f"the POST got HTTP {status}" + (f": {text}" if text else ""))

    def _end(self, why: str) -> None:
        self._why = self._why or why
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()

    async def stop(self, grace_s: float = 5.0) -> int | None:
        """Close the stream (the server ends the session when its GET goes); nothing to reap."""
        if self._reader is None:
            self._close_response()
            self._leave()
            return None
        self._end("closed by the proxy")
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            async with asyncio.timeout(grace_s):
                await asyncio.gather(self._reader, return_exceptions=True)
        return None

    def _close_response(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None

    def _leave(self) -> None:
        if self._admitted:
            self._admitted = False
            self._release()


class SseConnector:
    """Makes the SSE connections of one upstream (the `process_factory` of an SSE server), bounded
    in number: `max_sessions` at once, over every use (legacy clients' sessions, pooled ones)."""

    accepts_headers = True  # with_headers(): the caller's credentials go on the GET and the POSTs
    span_transport = "http"  # upstream/stdio.py span_transport: its exchanges are POSTs, not a pipe

    def __init__(
        self,
        sse_url: str,
        name: str,
        session: aiohttp.ClientSession,
        *,
        static_headers: Mapping[str, str],
        connect_timeout_s: float,
        endpoint_timeout_s: float,
        max_event_bytes: int,
        max_sessions: int,
        tally: Tally | None = None,
    ) -> None:
        self.sse_url = sse_url
        self.name = name
        self.session = session
        self._static = dict(static_headers)
        self._connect_timeout_s = connect_timeout_s
        self._endpoint_timeout_s = endpoint_timeout_s
        self._max_event_bytes = max_event_bytes
        self.max_sessions = max_sessions
        self.open = 0
        self._tally = tally

    def _admit(self) -> bool:
        if self.open >= self.max_sessions:
            return False
        self.open += 1
        return True

    def _release(self) -> None:
        self.open -= 1

    def __call__(
        self,
        *,
        on_message: Callable[[JSONDict], None],
        on_exit: Callable[[int | None], None],
        headers: Mapping[str, str] | None = None,
    ) -> SseConnection:
        return SseConnection(
            self.sse_url,
            name=self.name,
            session=self.session,
            headers=self._static,
            credentials=headers,
            connect_timeout_s=self._connect_timeout_s,
            endpoint_timeout_s=self._endpoint_timeout_s,
            max_event_bytes=self._max_event_bytes,
            on_message=on_message,
            on_exit=on_exit,
            tally=self._tally,
            admit=self._admit,
            release=self._release,
        )

    async def close(self) -> None:
        await self.session.close()

    @staticmethod
    def client_session(connect_timeout_s: float) -> aiohttp.ClientSession:
        # Unbounded pool: each session's stream holds a connection for its life; the bound is
        # max_sessions, and the POSTs need connections of their own besides.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=True, keepalive_timeout=4.0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        # No cookie jar: its sessions serve every caller (upstream/http.py client_session).
        return aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
        )


_REFUSALS = (400, 404, 405)  # how a 2024-11-05 server refuses a POST to its SSE URL


async def serves_sse(url: str, session: aiohttp.ClientSession, headers: Mapping[str, str], timeout_s: float) -> bool:
    """Whether `url` is a 2024-11-05 HTTP+SSE server's SSE URL rather than a Streamable HTTP
    endpoint (2025-03-26 basic/transports §Backward Compatibility): a POST there is refused with
    400/404/405 and a body that is no JSON-RPC message (a Streamable HTTP server refusing a
    sessionless request says so in JSON-RPC), and a GET opens a stream whose first event is an
    `endpoint` on the URL's origin. The POST is the era probe's `server/discover` with its headers:
    it opens no session anywhere and is a well-formed request to a 2026-07-28 server, which judges
    every message it gets. Any other answer, or none within `timeout_s`, is not such a server."""
    message = probe_request("mcp-era-proxy-transport-probe")
    probe = jsonrpc.encode(message)
    post_headers = {
        **headers,
        **upstream_headers(message, LATEST_MODERN),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=probe, headers=post_headers, allow_redirects=False) as response:
                if response.status not in _REFUSALS:
                    return False
                body = await response.content.read(_POST_BODY_LIMIT)
            with contextlib.suppress(jsonrpc.DecodeError):
                if jsonrpc.kind(jsonrpc.decode(body)) != "invalid":
                    return False
            get_headers = {**headers, "Accept": "text/event-stream"}
            async with session.get(url, headers=get_headers, allow_redirects=False) as response:
                content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if response.status != 200 or content_type != "text/event-stream":
                    return False
                events = SseEvents(response, _POST_BODY_LIMIT)
                while (event := await events.next()) is not None:
                    if event.event == "endpoint":
                        try:
                            resolve_endpoint(url, event.data)
                        except EndpointError:
                            return False
                        return True
                return False
    except (TimeoutError, aiohttp.ClientError, OverflowError):
        return False
