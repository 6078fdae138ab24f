"""The MCP endpoint over Streamable HTTP: POST, GET and DELETE on one path.

Each POST is classified by era (protocol.classify), then handed to the relay for that pairing.
Everything the client gets back is JSON-RPC: never a traceback or an HTML page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import structlog
from aiohttp import web

from ..config import Settings
from ..errors import ProxyError, session_not_found
from ..metrics import Metrics, RequestMetrics, method_label
from ..protocol import jsonrpc
from ..protocol.classify import Route, classify_post
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from ..protocol.methods import CACHEABLE_METHODS
from ..protocol.modern_to_legacy import listen_closed
from ..protocol.modern_validate import ModernRequest, header_view, validate_request
from ..protocol.status import Rejection
from ..protocol.versions import LEGACY_VERSIONS, Era
from ..relay.detect import EraDetector
from ..relay.legacy_to_modern import LegacyToModern, upstream_error, upstream_timeout
from ..relay.modern_to_legacy import ListenBridge, ModernToLegacy
from ..relay.passthrough import LegacyFacade, ModernPassThrough
from ..sessions import LegacySession, principal_of, short_hash
from ..upstream.errors import UpstreamError
from ..upstream.http import HttpUpstream
from .sse import SSE_HEADERS, RequestReply, SseStream, json_response

log = structlog.get_logger("mcp_era_proxy.http")
LegacySessions = LegacyToModern | LegacyFacade  # both hold legacy sessions behind one interface

# Headers carried from the client to the upstream, beside the ones the proxy computes.
_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
_PASSTHROUGH_PREFIXES = ("mcp-",)
_SESSION_HEADER_LOWER = SESSION_HEADER.lower()
_SMALL_REPLY = 1024 * 1024  # same-era replies up to this size (with a Content-Length) are sent in one piece


def error_reply(exc: ProxyError, era: Era, request_id: Any = None) -> web.Response:
    return json_response(exc.reply(request_id), exc.status_for(era), exc.headers or None)


class McpEndpoint:
    """Routes each message by the client's era and the upstream's (detected) era.

    Translated pairs go to their relay: `legacy_clients` (legacy client, modern upstream) and
    `modern_clients` (modern client, legacy upstream). Same-era pairs are relayed byte for byte
    over HTTP, or message by message over stdio (`modern_stdio`, `legacy_stdio`).
    """

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        detector: EraDetector,
        *,
        legacy_clients: LegacyToModern,
        modern_clients: ModernToLegacy,
        http_upstream: HttpUpstream | None = None,
        modern_stdio: ModernPassThrough | None = None,
        modern_http: ModernPassThrough | None = None,
        legacy_stdio: LegacyFacade | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._detector = detector
        self._legacy_clients = legacy_clients
        self._modern_clients = modern_clients
        self._http = http_upstream
        self._modern_stdio = modern_stdio
        self._modern_http = modern_http  # cacheable same-era requests over HTTP, message by message
        self._legacy_stdio = legacy_stdio
        self._upstream_name = settings.upstream.name
        self._keepalive_s = settings.streams.keepalive_s
        self._request_metrics = RequestMetrics(metrics)
        # The access log line is built (and the session id hashed) only when info is logged.
        self._log_requests = logging.getLevelNamesMapping()[settings.logging.level.upper()] <= logging.INFO

    async def _era(self) -> Era:
        try:
            return await self._detector.current()
        except UpstreamError as exc:
            self._metrics.upstream_errors.labels(self._upstream_name, exc.kind).inc()
            raise upstream_error(exc) from None

    def _legacy_relay(self, era: Era) -> LegacySessions | None:
        """Who holds legacy sessions for this upstream era (None: relayed byte for byte)."""
        return self._legacy_clients if era is Era.MODERN else self._legacy_stdio

    # ------------------------------------------------------------ caller context

    def _auth_headers(self, request: web.BaseRequest) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self._settings.upstream.forward_authorization and "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        for name in _TRACE_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        return headers

    def _principal(self, request: web.BaseRequest) -> str:
        header = self._settings.security.identity_header or "Authorization"
        return principal_of(request.headers.get(header))

    # ------------------------------------------------------------ POST

    async def post(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        record = _Record()
        try:
            response = await self._post(request, record)
        except ProxyError as exc:
            record.outcome = exc.outcome if exc.outcome != "error" else "rejected"
            response = error_reply(exc, Era(record.downstream_era), record.request_id)
        except asyncio.CancelledError:
            record.outcome = "cancelled"
            record.status = 499  # client closed the connection
            self._observe(record, started)
            raise
        record.status = response.status
        self._observe(record, started)
        return response

    async def _post(self, request: web.Request, record: _Record) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProxyError(jsonrpc.INVALID_REQUEST, "request body too large", status=413) from None
        try:
            body = jsonrpc.decode(raw)
        except jsonrpc.DecodeError:
            raise ProxyError(jsonrpc.PARSE_ERROR, "Parse error: body is not valid JSON", refused=True) from None
        record.request_id = jsonrpc.id_of(body)
        session_id = request.headers.get(SESSION_HEADER)
        route = classify_post(body, session_id, request.headers.get(PROTOCOL_VERSION_HEADER))
        if isinstance(route, Rejection):
            raise ProxyError.rejected(route)
        era = await self._era()
        record.upstream_era = era.value
        if route is Route.MODERN:
            record.downstream_era = "modern"
            record.method = body.get("method")
            return await self._modern(request, raw, body, record, era)
        relay = self._legacy_relay(era)
        if relay is None:  # legacy client, legacy HTTP upstream: the upstream's own session
            record.method = body.get("method") if isinstance(body, dict) else "batch"
            if any(jsonrpc.kind(item) == "invalid" for item in (body if isinstance(body, list) else [body])):
                raise ProxyError(jsonrpc.INVALID_REQUEST, "not a valid JSON-RPC 2.0 message", refused=True)
            return await self._pass_through(request, "POST", raw, record, legacy=True)
        if route is Route.LEGACY_INITIALIZE:
            return await self._initialize(request, relay, body, record)
        assert session_id is not None
        session = await self._session(request, relay, session_id)
        record.session = session.id
        if route is Route.LEGACY_BATCH:
            return await self._batch(request, relay, session, body, record)
        return await self._legacy_message(request, relay, session, body, record)

    async def _initialize(
        self, request: web.Request, relay: LegacySessions, body: dict[str, Any], record: _Record
    ) -> web.StreamResponse:
        record.method = "initialize"
        if jsonrpc.kind(body) != "request":
            raise ProxyError(jsonrpc.INVALID_REQUEST, "initialize must be a JSON-RPC request", refused=True)
        try:
            result, session_id = await relay.initialize(body, self._principal(request), self._auth_headers(request))
        except ProxyError as exc:
            record.outcome = exc.outcome
            return error_reply(exc, Era.LEGACY, body["id"])
        record.session = session_id
        return json_response(jsonrpc.result_response(body["id"], result), headers={SESSION_HEADER: session_id})

    async def _session(self, request: web.BaseRequest, relay: LegacySessions, session_id: str) -> LegacySession:
        session = await relay.resolve(session_id, self._principal(request))
        if session is None:
            raise session_not_found()
        version = request.headers.get(PROTOCOL_VERSION_HEADER)
        if version is not None and version not in LEGACY_VERSIONS:
            raise ProxyError(
                jsonrpc.INVALID_REQUEST, f"unsupported MCP-Protocol-Version {version!r} for this session", refused=True
            )
        return session

    async def _legacy_message(
        self,
        request: web.Request,
        relay: LegacySessions,
        session: LegacySession,
        body: dict[str, Any],
        record: _Record,
    ) -> web.StreamResponse:
        kind = jsonrpc.kind(body)
        record.method = body.get("method") if kind != "response" else "response"
        if kind == "invalid":
            raise ProxyError(jsonrpc.INVALID_REQUEST, "not a valid JSON-RPC 2.0 message", refused=True)
        if kind == "notification":
            await relay.handle_notification(session, body)
            return web.Response(status=202)
        if kind == "response":
            if not relay.handle_response(session, body):
                log.info("unexpected_response", session=short_hash(session.id), id=body.get("id"))
            return web.Response(status=202)
        async with RequestReply(request, self._keepalive_s) as reply:
            message = await self._run(request, relay, session, body, reply, record)
            return await reply.finish(message)

    async def _run(
        self,
        request: web.Request,
        relay: LegacySessions,
        session: LegacySession,
        body: dict[str, Any],
        reply: RequestReply,
        record: _Record,
    ) -> dict[str, Any] | None:
        """One legacy request; returns the final message (None: the client cancelled it)."""
        try:
            message = await relay.handle_request(session, body, reply, self._auth_headers(request))
        except ProxyError as exc:
            record.outcome = exc.outcome
            # A batch shares `reply`: only an error that needs its own HTTP status stops it opening.
            if exc.status_for(Era.LEGACY) != 200 and not await reply.streaming():
                raise  # e.g. an upstream 401: relayed with its status and WWW-Authenticate
            return exc.reply(body["id"])
        if message is None:
            record.outcome = "cancelled"
        elif "error" in message:
            record.outcome = "error"
        return message

    async def _batch(
        self, request: web.Request, relay: LegacySessions, session: LegacySession, body: list[Any], record: _Record
    ) -> web.StreamResponse:
        """JSON-RPC batches exist only in 2025-03-26 (reference §7.1)."""
        record.method = "batch"
        if session.legacy_version != "2025-03-26":
            raise ProxyError(
                jsonrpc.INVALID_REQUEST, f"batches are not part of protocol {session.legacy_version}", refused=True
            )
        requests: list[dict[str, Any]] = []
        for item in body:
            kind = jsonrpc.kind(item)
            if kind == "request" and item["method"] == "initialize":
                raise ProxyError(jsonrpc.INVALID_REQUEST, "initialize cannot be batched", refused=True)
            if kind == "invalid":
                raise ProxyError(jsonrpc.INVALID_REQUEST, "batch holds an invalid JSON-RPC message", refused=True)
            if kind == "notification":
                await relay.handle_notification(session, item)
            elif kind == "response":
                relay.handle_response(session, item)
            else:
                requests.append(item)
        if not requests:
            return web.Response(status=202)
        async with RequestReply(request, self._keepalive_s) as reply:
            try:
                # Each item's failure is its own error reply; one that needs the HTTP status of the
                # whole reply (an upstream 401) ends the batch: its siblings are cancelled first.
                async with asyncio.TaskGroup() as group:
                    items = [
                        group.create_task(self._run(request, relay, session, item, reply, _Record()))
                        for item in requests
                    ]
            except* ProxyError as failed:
                raise failed.exceptions[0] from None
            finals = [final for task in items if (final := task.result()) is not None]
            if not await reply.streaming():
                return json_response(finals)
            for final in finals:
                await reply.send(final)
            return await reply.stream.close()

    # ------------------------------------------------------------ modern clients, legacy upstream

    async def _modern(
        self, request: web.Request, raw: bytes, body: Any, record: _Record, era: Era
    ) -> web.StreamResponse:
        """Validate exactly as a 2026-07-28 server must, then translate or relay it."""
        kind = jsonrpc.kind(body)
        if kind == "notification":
            return web.Response(status=202)  # nothing to act on: over HTTP a closed stream cancels
        if kind != "request":
            raise ProxyError(
                jsonrpc.INVALID_REQUEST, "expected a single JSON-RPC request or notification", refused=True
            )
        checked = validate_request(body, header_view(request.headers.items()))
        if isinstance(checked, Rejection):
            raise ProxyError.rejected(checked)
        same_era = self._modern_stdio if self._http is None else self._modern_http
        if era is Era.MODERN and self._http is not None and checked.method not in CACHEABLE_METHODS:
            return await self._pass_through(request, "POST", raw, record, legacy=False)
        principal, auth = self._principal(request), self._auth_headers(request)
        if checked.method == "subscriptions/listen":
            if era is Era.MODERN:
                return await self._listen_same_era(
                    request, checked, same_era, _forward_headers(request, auth, legacy=False)
                )
            return await self._listen(request, checked, principal, auth, record)
        async with RequestReply(request, self._keepalive_s) as reply:
            try:
                if era is Era.MODERN:
                    assert same_era is not None
                    message, status = await same_era.handle(
                        checked, reply, _forward_headers(request, auth, legacy=False), principal
                    )
                else:
                    message, status = await self._modern_clients.handle(checked, reply, principal, auth)
            except ProxyError as exc:
                record.outcome = exc.outcome
                if not await reply.streaming():
                    raise
                message, status = exc.reply(body["id"]), 200
            if "error" in message:
                record.outcome = "error" if status == 200 else "rejected"
            return await reply.finish(message, status)

    async def _listen_same_era(
        self, request: web.Request, checked: ModernRequest, same_era: ModernPassThrough | None, headers: dict[str, str]
    ) -> web.StreamResponse:
        # Message by message even over HTTP: at shutdown the proxy ends it with the completion result.
        assert same_era is not None
        sse = SseStream(request, self._keepalive_s)
        gauge = self._metrics.streams_open.labels("downstream_listen")
        gauge.inc()
        try:
            await same_era.listen(checked, sse.send, headers)
        except ProxyError as exc:
            if not sse.started:
                raise
            with contextlib.suppress(ConnectionError, RuntimeError):
                await sse.send(exc.reply(checked.message["id"]))
        except (ConnectionError, RuntimeError):
            pass  # the client went away: leaving the exchange cancelled the listen upstream
        finally:
            gauge.dec()
            sse.abort()
        return await sse.close()

    async def _listen(
        self, request: web.Request, checked: ModernRequest, principal: str, auth: dict[str, str], record: _Record
    ) -> web.StreamResponse:
        bridge = ListenBridge(self._modern_clients, checked, principal, auth)
        try:
            acknowledgement = await bridge.open()
        except ProxyError:
            self._modern_clients.tasks.spawn(bridge.close())
            raise
        sse = SseStream(request, self._keepalive_s)
        gauge = self._metrics.streams_open.labels("downstream_listen")
        gauge.inc()
        try:
            await sse.send(acknowledgement)
            while True:
                try:
                    async with asyncio.timeout(self._keepalive_s):
                        message = await bridge.queue.get()
                except TimeoutError:
                    if not bridge.alive:
                        break  # the upstream session is gone: end the stream, the client may listen again
                    continue
                if message is None:
                    # The proxy ends the subscription (shutdown): say so with the completion result.
                    await sse.send(listen_closed(bridge.subscription_id))
                    break
                await sse.send(message)
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            gauge.dec()
            sse.abort()
            self._modern_clients.tasks.spawn(bridge.close())
        return await sse.close()

    # ------------------------------------------------------------ same-era pass-through

    async def _pass_through(
        self, request: web.Request, method: str, raw: bytes | None, record: _Record, *, legacy: bool
    ) -> web.StreamResponse:
        """Same era on both sides: relay bytes unchanged, streaming them as they arrive.

        A legacy session maps one to one onto the upstream's (its id and Last-Event-ID pass).
        """
        headers = _forward_headers(request, self._auth_headers(request), legacy=legacy)
        assert self._http is not None, "byte-for-byte relaying needs an HTTP upstream"
        try:
            async with asyncio.timeout(self._settings.upstream.request_timeout_s if method == "POST" else None):
                async with self._http.forward(method, raw, headers) as upstream:
                    out_headers = {}
                    for name in ("Content-Type", "WWW-Authenticate", "Allow") + ((SESSION_HEADER,) if legacy else ()):
                        if name in upstream.headers:
                            out_headers[name] = upstream.headers[name]
                    record.outcome = "ok" if upstream.status < 400 else "error"
                    if out_headers.get("Content-Type", "").startswith("text/event-stream"):
                        out_headers.update(SSE_HEADERS)
                    elif (upstream.content_length or _SMALL_REPLY + 1) <= _SMALL_REPLY:
                        # A small whole reply: one write instead of a chunked stream.
                        return web.Response(status=upstream.status, headers=out_headers, body=await upstream.read())
                    response = web.StreamResponse(status=upstream.status, headers=out_headers)
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                    return response
        except UpstreamError as exc:
            self._metrics.upstream_errors.labels(self._upstream_name, exc.kind).inc()
            raise upstream_error(exc) from None
        except TimeoutError:
            raise upstream_timeout(self._upstream_name) from None

    # ------------------------------------------------------------ GET / DELETE

    async def get(self, request: web.Request) -> web.StreamResponse:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return _method_not_allowed()
        try:
            relay = self._legacy_relay(await self._era())
            if relay is None:
                return await self._pass_through(request, "GET", None, _Record(), legacy=True)
            session = await self._session(request, relay, session_id)
            stream_handle = relay.open_get_stream(session)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        sse = SseStream(request, self._keepalive_s)
        gauge = self._metrics.streams_open.labels("downstream_get")
        gauge.inc()
        try:
            await sse.start()
            while True:
                message = await stream_handle.queue.get()
                if message is None:
                    break
                await sse.send(message)
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            gauge.dec()
            relay.close_get_stream(session.id, stream_handle)
            sse.abort()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await sse.close()
        return sse.response or web.Response(status=204)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return _method_not_allowed()
        try:
            relay = self._legacy_relay(await self._era())
            if relay is None:
                return await self._pass_through(request, "DELETE", None, _Record(), legacy=True)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        session = await relay.resolve(session_id, self._principal(request))
        if session is None:
            return error_reply(session_not_found(), Era.LEGACY)
        await relay.close(session.id, reason="deleted")
        return web.Response(status=200)

    # ------------------------------------------------------------ observability

    def _observe(self, record: _Record, started: float) -> None:
        elapsed = time.perf_counter() - started
        self._request_metrics.observe(
            method_label(record.method), record.downstream_era, record.upstream_era, record.outcome, elapsed
        )
        if not self._log_requests:
            return
        log.info(
            "request",
            method=record.method if isinstance(record.method, str) else None,
            downstream_era=record.downstream_era,
            upstream_era=record.upstream_era,
            outcome=record.outcome,
            status=record.status,
            latency_ms=round(elapsed * 1000, 3),
            session=short_hash(record.session) if record.session else None,
        )


class _Record:
    """What the access log and metrics say about one POST."""

    __slots__ = ("downstream_era", "method", "outcome", "request_id", "session", "status", "upstream_era")

    def __init__(self) -> None:
        self.method: Any = None
        self.downstream_era = "legacy"
        self.upstream_era = "unknown"
        self.outcome = "ok"
        self.status = 200
        self.session: str | None = None
        self.request_id: Any = None


def _method_not_allowed() -> web.Response:
    return json_response(
        jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Method not allowed"), 405, {"Allow": "POST"}
    )


__all__ = ["McpEndpoint", "UpstreamError"]


def _forward_headers(request: web.BaseRequest, auth: dict[str, str], *, legacy: bool) -> dict[str, str]:
    """What a same-era request carries upstream: credentials, trace, its Mcp-* headers; for a legacy
    session also its id and Last-Event-ID (it maps one to one onto the upstream's)."""
    headers = dict(auth)
    for name, value in request.headers.items():
        lowered = name.lower()
        if lowered.startswith(_PASSTHROUGH_PREFIXES):
            if legacy or lowered != _SESSION_HEADER_LOWER:
                headers[name] = value
        elif legacy and lowered == "last-event-id":
            headers[name] = value
    return headers
