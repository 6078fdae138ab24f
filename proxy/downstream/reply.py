"""The reply to a downstream request: JSON-RPC messages written to an aiohttp response as JSON or as an SSE stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiohttp import web

from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol.sse import KEEPALIVE, encode_event
from ..protocol.versions import Era
from ..relay.bytes import ByteReply
from ..relay.channel import RequestChannel
from .resume import EventIds

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell nginx-style intermediaries not to buffer the stream
}


def accepts_sse(request: web.BaseRequest) -> bool:
    accept = request.headers.get("Accept", "*/*")
    return "text/event-stream" in accept or "*/*" in accept


def json_response(message: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=jsonrpc.encode(message), status=status, content_type="application/json", headers=headers)


def error_reply(exc: ProxyError, era: Era, request_id: Any = None) -> web.Response:
    """A refusal or failure as the whole reply: its JSON-RPC error with the HTTP status `era` gives it."""
    return json_response(exc.reply(request_id), exc.status_for(era), exc.headers or None)


_ENDING_S = 1.0  # how long the end of a failed stream may take to write (a client that does not read)


async def relay_reply(
    request: web.BaseRequest, forward: AbstractAsyncContextManager[ByteReply]
) -> tuple[web.StreamResponse, str]:
    """Write a reply relayed byte for byte (relay/bytes.py); return it and the request's outcome.

    A whole reply goes out in one write. An SSE stream goes out as it arrives, and once it has
    started, a failure (the upstream broke the stream or sent an invalid event, the request timed
    out) can only end it: never a second HTTP response inside the first (docs/design.md §Errors).
    It ends with an event carrying the JSON-RPC error for each request not answered yet, and the
    connection closes, so that nothing can follow on it and a kept-alive client sees the end at once.
    A client that goes away while its stream is written is the request's cancellation (leaving
    `forward` closes the upstream's reply); one that closes once it has its events, before the
    stream's last chunk, had its reply. So did one that leaves once every answer its POST awaited
    is written, while the upstream's stream has yet to end: its handler is cancelled then, and
    `DELIVERED` on the request tells the endpoint the request was answered.
    """
    stream: web.StreamResponse | None = None
    reply: ByteReply | None = None
    try:
        async with forward as reply:
            if reply.chunks is None:
                body = web.Response(status=reply.status, headers=reply.headers, body=reply.body)
                return body, "ok" if reply.status < 400 else "error"
            stream = web.StreamResponse(status=reply.status, headers={**reply.headers, **SSE_HEADERS})
            await stream.prepare(request)
            request[STARTED] = stream
            awaited = bool(reply.unanswered)  # a POST's stream answers its requests; a GET's none
            async for chunk in reply.chunks:
                try:
                    await stream.write(chunk)
                except ConnectionError:  # the client went away
                    return stream, "cancelled"
                if awaited and not reply.unanswered:  # every answer is written
                    request[DELIVERED] = True
                    awaited = False
    except ProxyError as exc:
        if stream is None or reply is None:
            raise  # nothing sent yet: the error is the whole reply
        await end_with_error(request, stream, reply.unanswered, exc)
        return stream, exc.outcome
    with contextlib.suppress(ConnectionError):  # closed after its last event: it had them all
        await stream.write_eof()
    return stream, "ok"


async def end_with_error(
    request: web.BaseRequest, stream: web.StreamResponse, request_ids: Iterable[Any], exc: ProxyError
) -> None:
    """End a started SSE reply with an event carrying `exc` for each request not answered yet, then
    close the connection: nothing may follow on it (a relayed stream that failed, a call cut at
    shutdown)."""
    stream.force_close()
    try:
        async with asyncio.timeout(_ENDING_S):
            for request_id in request_ids:
                await stream.write(encode_event(jsonrpc.encode(exc.reply(request_id)), event="message"))
            await stream.write_eof()
    except (ConnectionError, RuntimeError, TimeoutError):
        if request.transport is not None:
            request.transport.abort()  # the client is gone or does not read: nothing more to say


# The SSE response a request's handler has started, if any: what a call cut at shutdown ends with
# its error event (downstream/http.py McpEndpoint.drain) instead of a second HTTP response.
STARTED: Any = (
    web.RequestKey("started_stream", web.StreamResponse) if hasattr(web, "RequestKey") else "mcp_era_proxy.started"
)
# True once a relayed stream has written every answer its POST awaited (relay_reply): a client that
# leaves after that had its reply, though its handler is cancelled.
DELIVERED: Any = web.RequestKey("delivered", bool) if hasattr(web, "RequestKey") else "mcp_era_proxy.delivered"


class SseStream:
    """An SSE response opened on first use, with keep-alive comments while it is quiet; with
    `event_ids`, every message carries an id (downstream/resume.py). A keep-alive that cannot be
    written is how a quiet stream learns its client went away: `on_gone` is called then.

    A legacy session's GET stream is one, held open and mostly quiet, by the thousand: its
    keep-alive is a timer, and a task only while a comment is being written (a task sleeping
    between comments, with its coroutine and its sleep, was some 1.7 KB a stream)."""

    __slots__ = (
        "_event_ids",
        "_headers",
        "_keepalive",
        "_keepalive_s",
        "_last_write",
        "_lock",
        "_on_gone",
        "_pinging",
        "_request",
        "response",
    )

    def __init__(
        self,
        request: web.BaseRequest,
        keepalive_s: float,
        headers: dict[str, str] | None = None,
        event_ids: EventIds | None = None,
        on_gone: Callable[[], None] | None = None,
    ) -> None:
        self._request = request
        self._event_ids = event_ids
        self._on_gone = on_gone
        self._keepalive_s = keepalive_s
        self._headers = headers
        self.response: web.StreamResponse | None = None
        self._keepalive: asyncio.TimerHandle | None = None  # armed once the response is started
        self._pinging: asyncio.Task[None] | None = None  # a keep-alive comment being written
        self._last_write = 0.0
        self._lock = asyncio.Lock()

    @property
    def started(self) -> bool:
        return self.response is not None

    async def start(self) -> web.StreamResponse:
        async with self._lock:
            return await self._start()

    async def _start(self) -> web.StreamResponse:
        # Under _lock: two writers arriving together must not both prepare the response.
        if self.response is None:
            headers = {**SSE_HEADERS, **self._headers} if self._headers else SSE_HEADERS  # aiohttp copies them
            response = web.StreamResponse(status=200, headers=headers)
            await response.prepare(self._request)
            self.response = self._request[STARTED] = response
            if self._event_ids is not None and self._event_ids.prime:
                await response.write(self._event_ids.priming_event())
            self._last_write = time.monotonic()
            self._arm(self._keepalive_s)
        return self.response

    async def send(self, message: Any) -> None:
        data = jsonrpc.encode(message)
        if self._event_ids is None:
            await self.write(encode_event(data))
            return
        async with self._lock:
            response = await self._start()  # the priming event, if any, takes the first id
            await response.write(encode_event(data, event_id=self._event_ids.next()))
            self._last_write = time.monotonic()

    async def write(self, data: bytes) -> None:
        async with self._lock:
            response = await self._start()
            await response.write(data)
            self._last_write = time.monotonic()

    async def pump(self, events: asyncio.Queue[bytes | None]) -> None:
        """Write the encoded events `events` holds, in order, until it yields None; raises
        ConnectionError or RuntimeError once the client is gone."""
        await self.start()
        while (event := await events.get()) is not None:
            await self.write(event)

    def _arm(self, delay: float) -> None:
        self._keepalive = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        """The keep-alive timer fired: a comment if the stream was quiet that long, else the timer
        again for the rest (a write meanwhile moved the time; writes do not touch the timer)."""
        wait = self._last_write + self._keepalive_s - time.monotonic()
        if wait > 0:
            self._arm(wait)
        else:
            self._keepalive = None
            self._pinging = asyncio.create_task(self._ping())

    async def _ping(self) -> None:
        try:
            async with self._lock:
                assert self.response is not None
                await self.response.write(KEEPALIVE)
                self._last_write = time.monotonic()
        except (ConnectionError, RuntimeError):
            if self._on_gone is not None:
                self._on_gone()
            return
        self._arm(self._keepalive_s)

    async def close(self) -> web.StreamResponse:
        response = await self.start()
        pinging = self._stop_keepalive()
        if pinging is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await pinging
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response

    def abort(self) -> None:
        self._stop_keepalive()

    def _stop_keepalive(self) -> asyncio.Task[None] | None:
        """Disarm the keep-alive; the comment being written, if any, cancelled (to be awaited)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        pinging, self._pinging = self._pinging, None
        if pinging is None or pinging.done():
            return None
        pinging.cancel()
        return pinging


_PRIME_AFTER_S = 1.0  # a reply not done by then becomes a stream, its priming event first


class ReplyClosed(ConnectionError):
    """The handler of this reply has ended: nothing more can be written to it. A relay reads it
    like a client that went away."""


class RequestReply(RequestChannel):
    """The reply to one downstream request: JSON unless something must precede the result, or the
    result takes longer than `keepalive_s`. Then it becomes an SSE stream with keep-alive comments,
    so that intermediaries with an idle timeout (ingress-nginx: 60 s) do not cut a long call.

    It lives exactly as long as its handler (`async with`): leaving the block cancels the keep-alive
    timer and what it started, and every later write raises ReplyClosed, so nothing can reach the
    connection once the handler has answered (a kept-alive connection's next request would read it).
    """

    __slots__ = ("_event_ids", "_keepalive_s", "_opening", "_request", "_slow", "_stream", "can_stream", "closed")

    def __init__(self, request: web.BaseRequest, keepalive_s: float, event_ids: EventIds | None = None) -> None:
        self.can_stream = accepts_sse(request)
        self._request = request
        self._event_ids = event_ids
        self._keepalive_s = keepalive_s
        self._stream: SseStream | None = None  # made on first use: most replies are plain JSON
        self._opening: asyncio.Task[None] | None = None
        self._slow: asyncio.TimerHandle | None = None
        self.closed = False

    @property
    def stream(self) -> SseStream:
        if self._stream is None:
            self._stream = SseStream(self._request, self._keepalive_s, event_ids=self._event_ids)
        return self._stream

    async def __aenter__(self) -> RequestReply:
        if self.can_stream:
            # A timer, not a task: most replies finish first, and cancelling a timer costs nothing.
            # A stream with a priming event opens sooner: a client can resume only a stream that
            # showed it an id, and a quiet call cut after this (its replica died) is not left
            # as a bare disconnect.
            primed = self._event_ids is not None and self._event_ids.prime
            delay = min(self._keepalive_s, _PRIME_AFTER_S) if primed else self._keepalive_s
            self._slow = asyncio.get_running_loop().call_later(delay, self._open_slow)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.closed = True
        if self._slow is not None:
            self._slow.cancel()
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opening
        if self._stream is not None:
            self._stream.abort()

    def _open_slow(self) -> None:
        transport = self._request.transport
        if not self.closed and not self.started and transport is not None and not transport.is_closing():
            self._opening = asyncio.create_task(self._write_keepalive())

    async def _write_keepalive(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.stream.write(KEEPALIVE)

    @property
    def started(self) -> bool:
        return self._stream is not None and self._stream.started

    @property
    def event_seq(self) -> int:
        """The sequence number of the last event sent (0: none, or no event ids)."""
        return self._event_ids.seq if self._event_ids is not None else 0

    async def streaming(self) -> bool:
        """Whether the reply is an SSE stream. From now on no keep-alive opens one (only a message
        sent can), so an error may still go out as plain JSON with its own HTTP status."""
        if self._slow is not None:
            self._slow.cancel()
        if self._opening is not None:
            await self._opening
        return self.started

    async def send(self, message: Any) -> None:
        if self.closed:
            raise ReplyClosed("the reply has been sent")
        await self.stream.send(message)

    async def finish(
        self, message: Any | None, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        if self._opening is None and self._stream is None and message is not None:  # the usual: plain JSON
            if self._slow is not None:
                self._slow.cancel()
            return json_response(message, status, headers)
        if not await self.streaming() and message is not None:
            return json_response(message, status, headers)
        if message is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.stream.send(message)
        return await self.stream.close()
