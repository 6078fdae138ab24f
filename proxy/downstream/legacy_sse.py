"""The deprecated HTTP+SSE transport (2024-11-05) for older clients: GET `downstream.sse.path`
opens a session's event stream, whose first event (`endpoint`) names the URL the client posts its
messages to; everything the server sends comes as `message` events on that stream.

Spec: 2024-11-05/basic/transports.mdx §HTTP with SSE, and 2025-11-25/basic/transports.mdx
§Backwards Compatibility (servers keep both endpoints beside the Streamable HTTP one).

Each event stream is one client, served through the proxy's own Streamable HTTP endpoint by an
EndpointBridge (downstream/bridge.py) on a private unix listener: the client gets exactly the
translation a Streamable HTTP legacy client of the same upstream gets, and its session ends with
its stream. The session id in the endpoint URL is sealed, names this replica (a POST that reaches
another replica is replayed here) and opens only for the caller who opened the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog
from aiohttp import web

from ..auth.identity import Identifier
from ..cluster.envelope import SSE_MESSAGE_ROUTE
from ..cluster.forward import Forwarder
from ..cluster.owners import Owner, OwnerGone, OwnerTokens
from ..config import Settings
from ..errors import ProxyError, session_not_found
from ..metrics import Metrics
from ..protocol import jsonrpc, meta
from ..protocol.sse import encode_event
from ..protocol.versions import Era
from ..state.sealing import Sealer
from ..state.sessions import short_hash
from .bridge import EndpointBridge
from .bridge_messages import MessageError, parse_message
from .reply import SseStream, error_reply, json_response

log = structlog.get_logger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PURPOSE = "legacy-sse-session"
SESSION_QUERY = "session_id"
# A replay from another replica names the session here (its URL is the replay endpoint's).
SESSION_HEADER = "Mcp-Era-Proxy-Sse-Session"
_MAX_QUEUED = 1024  # messages waiting for a client that does not read: then its stream is cut
_CLOSE_GRACE_S = 1.0  # a closed stream's requests in flight get this long, then are cancelled


class StreamWriter:
    """The MessageSink of one event stream: messages queue here and `pump` writes them in order
    on the stream (downstream/reply.py `SseStream`: keep-alive comments while it is quiet, which is
    how a client gone away is noticed)."""

    def __init__(self, request: web.BaseRequest, keepalive_s: float) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.broken = asyncio.Event()
        self.stream = SseStream(request, keepalive_s, on_gone=self._gone)

    def start(self) -> None:
        return None

    def write(self, message: Any) -> None:
        self._put(encode_event(jsonrpc.encode(message), event="message"))

    def write_raw(self, data: bytes) -> None:
        """A message of the endpoint's own SSE reply: already one JSON document."""
        self._put(encode_event(data, event="message"))

    def _put(self, event: bytes) -> None:
        if self.broken.is_set():
            return
        if self._queue.qsize() >= _MAX_QUEUED:
            log.warning("sse_client_not_reading", queued=self._queue.qsize())
            self.broken.set()
            self._queue.put_nowait(None)
            return
        self._queue.put_nowait(event)

    def end(self) -> None:
        """Ends the stream once what is queued is written (shutdown)."""
        self._queue.put_nowait(None)

    def _gone(self) -> None:
        self.broken.set()
        self._queue.put_nowait(None)  # the pump stops at once: nothing more can be written

    async def pump(self) -> None:
        try:
            await self.stream.pump(self._queue)
        except (ConnectionError, RuntimeError):
            return  # the client went away
        finally:
            self.broken.set()

    async def drain(self, within_s: float) -> None:
        return None  # the stream is over when the bridge closes: nothing more reaches the client

    async def close(self) -> None:
        self.broken.set()


@dataclass(slots=True)
class _Stream:
    principal: str
    bridge: EndpointBridge
    writer: StreamWriter


class LegacySseEndpoint:
    """GET `downstream.sse.path` (the event stream) and POST `downstream.sse.message_path`."""

    def __init__(
        self,
        settings: Settings,
        handlers: dict[str, Handler],
        identifier: Identifier,
        sealer: Sealer,
        owner: Owner,
        forwarder: Forwarder,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._config = settings.downstream.sse
        self._handlers = handlers  # the Streamable HTTP endpoint's, by method
        self._identifier = identifier
        self._owner = owner
        self._tokens = OwnerTokens(sealer, owner, _PURPOSE, str)  # the session_id: [boot, address, key]
        self._forwarder = forwarder
        self._gauge = metrics.streams_open.labels("downstream_sse")
        self._keepalive_s = settings.streams.keepalive_s
        self._max_depth = settings.security.max_json_depth
        self._streams: dict[str, _Stream] = {}
        self._identity_header = (settings.security.identity_header or "").lower()
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._private: str | None = None
        self._url = f"http://localhost{settings.path}"
        self._endpoint_ref = _endpoint_reference(self._config.path, self._config.message_path)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """The private listener the bridges reach the endpoint on: a unix socket in a fresh 0700
        directory nobody else can reach, served by the endpoint's own handlers."""
        from .server import runner as make_runner

        inner = web.Application(client_max_size=self._settings.security.max_body_bytes)
        path = self._settings.path
        inner.router.add_post(path, self._handlers["POST"])
        inner.router.add_get(path, self._handlers["GET"])
        inner.router.add_delete(path, self._handlers["DELETE"])
        self._private = await asyncio.to_thread(tempfile.mkdtemp, prefix="mcp-era-proxy-sse-")  # mode 0700
        socket_path = os.path.join(self._private, "mcp.sock")
        self._runner = make_runner(inner, self._settings)
        await self._runner.setup()
        await web.UnixSite(self._runner, socket_path).start()
        self._client = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path, limit=0), auto_decompress=False
        )

    def end_streams(self) -> None:
        """Shutdown begins: every event stream ends (its client reconnects elsewhere)."""
        for stream in list(self._streams.values()):
            stream.writer.end()

    async def close(self) -> None:
        for stream in list(self._streams.values()):
            stream.writer.end()
            await stream.bridge.close(_CLOSE_GRACE_S)
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._private is not None:
            await asyncio.to_thread(shutil.rmtree, self._private, ignore_errors=True)

    # ------------------------------------------------------------ GET: the event stream

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            identity = await self._identifier.identify(request)
            if self._client is None:
                raise ProxyError(jsonrpc.INTERNAL_ERROR, "the proxy is not serving HTTP+SSE clients", status=503)
            if len(self._streams) >= self._config.max_connections:
                raise ProxyError(
                    jsonrpc.INTERNAL_ERROR,
                    "too many HTTP+SSE streams open: try again later",
                    status=503,
                    headers={"Retry-After": "5"},
                )
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        key = secrets.token_hex(16)
        token = self._seal(key, identity.principal)
        writer = StreamWriter(request, self._keepalive_s)
        bridge = EndpointBridge(self._client, self._url, writer, self._max_depth, upstream=self._settings.upstream.name)
        bridge.feed_headers(self._caller_headers(request))  # the stream's own, until a message brings newer
        await writer.stream.write(
            encode_event(f"{self._endpoint_ref}?{SESSION_QUERY}={quote(token)}".encode(), event="endpoint")
        )
        self._streams[key] = _Stream(identity.principal, bridge, writer)
        self._gauge.inc()
        opened = time.monotonic()
        log.info("sse_stream_opened", stream=short_hash(key))
        bridge.start()
        try:
            await self._pump(request, writer)
        finally:
            self._streams.pop(key, None)
            self._gauge.dec()
            # The session ends with its stream: the bridge ends it at the endpoint too.
            await asyncio.shield(bridge.close(_CLOSE_GRACE_S, end_session=True))
            log.info("sse_stream_closed", stream=short_hash(key), seconds=round(time.monotonic() - opened, 1))
        return await writer.stream.close()

    async def _pump(self, request: web.Request, writer: StreamWriter) -> None:
        """Until the client goes or the stream ends; a client that stopped reading while a write
        waits on it (its queue overflowed) is cut off."""
        pump = asyncio.create_task(writer.pump())
        broken = asyncio.create_task(writer.broken.wait())
        try:
            await asyncio.wait({pump, broken}, return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():
                await asyncio.wait({pump}, timeout=_CLOSE_GRACE_S)
            if not pump.done() and request.transport is not None:
                request.transport.abort()
        finally:
            broken.cancel()
            pump.cancel()
            writer.stream.abort()  # no keep-alive once the stream is over
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    # ------------------------------------------------------------ POST: one message

    async def message(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._message(request)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)

    async def _message(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get(SESSION_QUERY) or request.headers.get(SESSION_HEADER)
        if not token:
            raise ProxyError(
                jsonrpc.INVALID_REQUEST,
                f"Invalid Request: the {SESSION_QUERY} parameter is missing",
                status=400,
                refused=True,
            )
        identity = await self._identifier.identify(request)
        named = self._open(token, identity.principal)
        if named is None:
            raise session_not_found()
        owner, key = named
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProxyError(jsonrpc.INVALID_REQUEST, "request body too large", status=413) from None
        if owner.boot != self._owner.boot:
            return await self._forward(request, raw, token, owner)
        stream = self._streams.get(key)
        if stream is None or stream.principal != identity.principal:
            raise session_not_found()
        try:
            message = parse_message(raw, self._max_depth)
        except MessageError as exc:
            return json_response(exc.reply, status=400)
        stream.bridge.feed(message, self._caller_headers(request))
        return web.Response(status=202, text="Accepted")

    async def _forward(self, request: web.Request, raw: bytes, token: str, owner: Owner) -> web.StreamResponse:
        """A stream held by another replica: the message is served there."""
        target = self._forwarder.stream_owner(f"{owner.boot}@{owner.address or ''}")
        if target is None:
            raise session_not_found()  # a replica nobody reaches, or a process since replaced
        try:
            return await self._forwarder.replay(
                request, raw, target, kind="sse", route=SSE_MESSAGE_ROUTE, extra_headers={SESSION_HEADER: token}
            )
        except OwnerGone:
            raise session_not_found() from None

    # ------------------------------------------------------------ pure parts

    def _seal(self, key: str, principal: str) -> str:
        return self._tokens.mint(key, short_hash(principal).encode())

    def _open(self, token: str, principal: str) -> tuple[Owner, str] | None:
        return self._tokens.open(token, short_hash(principal).encode())

    def _caller_headers(self, request: web.BaseRequest) -> dict[str, str]:
        """What of the client's headers its messages carry to the endpoint: who it is (its
        Authorization, the trusted identity header) and its trace context."""
        wanted = {"authorization", *meta.TRACE_KEYS}
        if self._identity_header:
            wanted.add(self._identity_header)
        return {name: value for name, value in request.headers.items() if name.lower() in wanted}


def _endpoint_reference(stream_path: str, message_path: str) -> str:
    """The message endpoint as the `endpoint` event names it: relative to the stream's URL when
    both share a folder (so a path prefix added in front, by an ingress, is kept), else absolute."""
    folder, _, _ = stream_path.rpartition("/")
    message_folder, _, name = message_path.rpartition("/")
    return name if folder == message_folder and name else message_path
