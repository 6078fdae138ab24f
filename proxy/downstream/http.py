"""The MCP endpoint over Streamable HTTP: POST, GET and DELETE on one path.

Each POST is classified by era (protocol.classify), and the routing table (relay.routes) says who
serves it for the upstream's (detected) era. This module only reads requests and writes replies:
everything the client gets back is JSON-RPC, never a traceback or an HTML page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from ..auth.identity import Identifier
from ..cluster.forward import Forwarder
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import client_checks, jsonrpc
from ..protocol import task_extension as te
from ..protocol.classify import SESSIONLESS, Route, classify_post
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from ..protocol.methods import CACHEABLE_METHODS, CORE_CLIENT_NOTIFICATIONS
from ..protocol.modern_validate import HeaderLookup, validate_request
from ..protocol.status import Rejection
from ..protocol.versions import MODERN_VERSIONS, Era
from ..relay.channel import Caller
from ..relay.detect import EraDetector
from ..relay.failures import UpstreamFailures
from ..relay.legacy_sessions import LegacySessionHost
from ..relay.routes import Router
from ..relay.tasks.host import LegacyTaskHost
from ..seams.asyncio_internals import task_of
from ..state.sealing import Sealer
from ..state.sessions import short_hash
from ..tracing import NO_TRACING, NULL_DOWNSTREAM, Tracing
from .access import Access
from .clients import ClientReport, Sighting
from .legacy_http import LegacyEndpoint, SessionHost
from .messages import (
    ByteSessions,
    Record,
    error_code,
    extension_ids,
    legacy_sighting,
    method_not_allowed,
    method_of,
    reason,
)
from .replicas import Steering
from .reply import DELIVERED, STARTED, RequestReply, SseStream, end_with_error, error_reply, relay_reply
from .steer import LOCAL, Replay, modern_topics

log = structlog.get_logger(__name__)

_LOGGED_METHOD_MAX = 200  # characters of a client's method name the access log keeps
_CUT_S = 1.0  # how long the calls cut at shutdown get to answer with their error and end


class McpEndpoint:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        detector: EraDetector,
        router: Router,
        failures: UpstreamFailures,
        forwarder: Forwarder | None = None,
        sealer: Sealer | None = None,
        boot: str = "",
        identifier: Identifier | None = None,
        tracing: Tracing = NO_TRACING,
        tasks: LegacyTaskHost | None = None,
        clients: ClientReport | None = None,
    ) -> None:
        # Who speaks which protocol (proxy/downstream/clients.py); legacy sessions relayed byte for byte are
        # the upstream's, so their client is remembered here by the session id it handed out.
        self._clients = clients if clients is not None else ClientReport(settings.clients.max_tracked, metrics)
        self._byte_sessions = ByteSessions()
        self._tracing = tracing  # one span per request, parented on its trace context (tracing/__init__.py)
        self._access = Access(settings, identifier)
        self._metrics = metrics
        self._detector = detector
        self._router = router
        self._failures = failures
        self._keepalive_s = settings.streams.keepalive_s
        self._max_depth = settings.security.max_json_depth
        # Where a message about something another replica owns is served (downstream/steer.py).
        self._steering = Steering(forwarder, tasks)
        self._legacy = LegacyEndpoint(self._access, self._steering, metrics, self._keepalive_s, sealer, boot)
        # POSTs being handled, each with the event its end sets (drain waits on them), and those
        # cut at shutdown: their cancellation is the proxy's, answered with SHUTTING_DOWN.
        # The POSTs under way; each one's Event is made only when a drain waits for it.
        self._posts: dict[asyncio.Task[Any], asyncio.Event | None] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        # The access log line is built (and the session id hashed) only when info is logged.
        self._log_requests = logging.getLevelNamesMapping()[settings.logging.level.upper()] <= logging.INFO

    async def _era(self, request: web.BaseRequest, hello: dict[str, Any] | None = None) -> Era:
        era = self._detector.known
        if era is not None:
            return era
        # Probed with the caller's Authorization when it may go upstream: a protected upstream
        # refuses an anonymous probe, and its 401 (challenge rewritten) starts the client's OAuth.
        # A legacy client's `initialize` (`hello`) goes with it: a stdio server started for the
        # probe may then be that client's, not started twice.
        credentials = self._access.probe_credentials(request)
        return await self._failures.reaching(self._detector.current(credentials, hello))

    # ------------------------------------------------------------ POST

    async def post(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        record = Record(self._tracing.downstream("POST", request.headers))
        task = task_of(asyncio.get_running_loop())  # asyncio.current_task(), without its Python frame on 3.11
        if task is not None:
            self._posts[task] = None
        try:
            try:
                response = await self._post(request, record)
            except ProxyError as exc:
                record.outcome = exc.outcome if exc.outcome != "error" else "rejected"
                record.error_code = exc.code
                response = error_reply(exc, Era(record.downstream_era), record.request_id)
            except asyncio.CancelledError:
                if task is None or task not in self._cut:
                    # The client closed the connection: before its answers (499), or once a relayed
                    # stream had written them all, while the upstream's was still ending (ok).
                    delivered = request.get(DELIVERED, False)
                    record.outcome = "ok" if delivered else "cancelled"
                    record.status = 200 if delivered else 499
                    self._observe(record, started)
                    raise
                task.uncancel()  # the proxy's own cancellation: the client is still there
                response = await self._cut_reply(request, record)
        finally:
            if task is not None:
                if (ended := self._posts.pop(task, None)) is not None:
                    ended.set()
                self._cut.discard(task)
        record.status = response.status
        self._observe(record, started)
        return response

    async def drain(self, grace_s: float) -> None:
        """Shutdown (listening stopped): the POSTs in flight get `grace_s` to finish; the rest are
        cut, each answered with SHUTTING_DOWN (retry it): HTTP 503 before a reply started, a last
        SSE event on one that had. Parked calls keep their hand-over (relay/modern_to_legacy.py)."""
        await self._posts_ended(list(self._posts), grace_s)
        rest = list(self._posts)  # each POST leaves it as it ends
        for task in rest:
            self._cut.add(task)
            task.cancel()
        await self._posts_ended(rest, _CUT_S)

    async def _posts_ended(self, tasks: list[asyncio.Task[Any]], within_s: float) -> None:
        """Wait (at most `within_s`) until the POSTs of `tasks` have ended."""
        waits = []
        for task in tasks:
            if task in self._posts:
                ended = self._posts[task]
                if ended is None:
                    ended = self._posts[task] = asyncio.Event()
                waits.append(asyncio.ensure_future(ended.wait()))
        if waits:
            await asyncio.wait(waits, timeout=within_s)
        for wait in waits:
            wait.cancel()

    async def _cut_reply(self, request: web.Request, record: Record) -> web.StreamResponse:
        """The reply of a call cut at shutdown, logged and counted as `shutdown`."""
        record.outcome, record.error_code = "shutdown", jsonrpc.SHUTTING_DOWN
        log.warning("call_cut_at_shutdown", method=record.method, downstream_era=record.downstream_era)
        cut = ProxyError(
            jsonrpc.SHUTTING_DOWN,
            "the proxy is shutting down and did not finish this call: retry it",
            status=503,
            outcome="shutdown",
        )
        stream: web.StreamResponse | None = request.get(STARTED)
        if stream is None:
            return error_reply(cut, Era(record.downstream_era), record.request_id)
        await end_with_error(request, stream, (record.request_id,), cut)
        return stream

    async def _post(self, request: web.Request, record: Record) -> web.StreamResponse:
        version = request.headers.get(PROTOCOL_VERSION_HEADER)
        if version in MODERN_VERSIONS:  # a refusal before the body is classified counts in the client's era
            record.downstream_era = "modern"
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProxyError(jsonrpc.INVALID_REQUEST, "request body too large", status=413) from None
        except web.RequestPayloadError as exc:  # e.g. a Content-Encoding the body does not follow
            raise ProxyError(
                jsonrpc.PARSE_ERROR, f"Parse error: the body cannot be read ({reason(exc)})", refused=True
            ) from None
        try:
            body = jsonrpc.decode(raw)
        except jsonrpc.TooDeep:
            raise ProxyError.rejected(client_checks.depth_rejection(self._max_depth)) from None
        except jsonrpc.DecodeError:
            raise ProxyError(jsonrpc.PARSE_ERROR, "Parse error: body is not valid JSON", refused=True) from None
        record.request_id = jsonrpc.id_of(body)
        record.method = method_of(body)
        if record.span is not NULL_DOWNSTREAM:
            record.span.begin(body)  # before any upstream exchange: theirs are its children
        self._access.check_headers(request)
        # Before anything reaches the upstream (era detection included): refused here in
        # resource_server mode without a valid token.
        caller = await self._access.post_caller(request)
        if client_checks.too_deep(body, self._max_depth, raw):
            raise ProxyError.rejected(client_checks.depth_rejection(self._max_depth))
        session_id = request.headers.get(SESSION_HEADER)
        route = classify_post(body, session_id, version)
        if isinstance(route, Rejection):
            raise ProxyError.rejected(route)
        # Known before the upstream's era is: a request that fails reaching it counts in its own.
        record.downstream_era = "modern" if route is Route.MODERN else "legacy"
        if route is not Route.MODERN:  # a message (a dict), or a batch (a list)
            problem = client_checks.message_problem(body) if type(body) is dict else _batch_problem(body)
            if problem is not None:
                raise ProxyError.rejected(problem)
        era = await self._era(request, body if route is Route.LEGACY_INITIALIZE and isinstance(body, dict) else None)
        record.upstream_era = str(era)  # its value (str's own __str__: no enum property per request)
        if route is Route.MODERN:
            return await self._modern(request, raw, body, record, era, caller)
        host = self._router[era].legacy
        if host is None:  # legacy client, legacy HTTP upstream: the upstream's own session
            if any(jsonrpc.kind(item) == "invalid" for item in (body if isinstance(body, list) else [body])):
                raise ProxyError(jsonrpc.INVALID_REQUEST, "not a valid JSON-RPC 2.0 message", refused=True)
            initialize = route is Route.LEGACY_INITIALIZE  # its client is known by the session its reply hands out
            if not initialize:
                # Counted before it is relayed, as a translated request is: a client that leaves
                # before the end (even once answered) still sent it.
                record.sighting = self._byte_sessions.sighting(body, session_id, None)
                record.session = session_id  # the upstream's own session
            response = await self._bytes(request, "POST", raw, record, legacy=True, message=body, caller=caller)
            if initialize:
                record.session = response.headers.get(SESSION_HEADER)  # the one its reply hands out
                record.sighting = self._byte_sessions.sighting(body, session_id, record.session)
            return response
        if route is Route.LEGACY_SESSIONLESS:
            raise ProxyError.rejected(SESSIONLESS)
        if route is Route.LEGACY_INITIALIZE:
            return await self._legacy.initialize(host, body, caller, record)
        assert session_id is not None  # session-less legacy messages were refused above
        session = await self._legacy.session(request, host, session_id, caller)
        record.session = session.id
        sighting = legacy_sighting(body, session.client_info, session.legacy_version)
        if sighting is None:  # one plain request: counted now, no Sighting made for it
            self._clients.seen_plain(session.client_info, session.legacy_version, "legacy")
        else:
            record.sighting = sighting
        if route is Route.LEGACY_BATCH:
            return await self._legacy.batch(request, host, session, body, caller, record)
        return await self._legacy.message(request, host, session, body, caller, record, raw)

    # ------------------------------------------------------------ modern clients

    async def _modern(
        self, request: web.Request, raw: bytes, body: Any, record: Record, era: Era, caller: Caller
    ) -> web.StreamResponse:
        """Validate exactly as a 2026-07-28 server must, then translate or relay it."""
        kind = jsonrpc.kind(body)
        if kind == "notification":
            return await self._modern_notification(request, raw, body, record, era, caller)
        if kind != "request":
            raise ProxyError(
                jsonrpc.INVALID_REQUEST, "expected a single JSON-RPC request or notification", refused=True
            )
        problem = client_checks.message_problem(body)
        if problem is not None:
            raise ProxyError.rejected(problem)
        checked = validate_request(body, HeaderLookup(request.headers))
        if isinstance(checked, Rejection):
            raise ProxyError.rejected(checked)
        params = jsonrpc.params_of(body)
        extensions = checked.capabilities.get("extensions")  # validated: an object when present
        input_round = "inputResponses" in params
        listen = checked.method == "subscriptions/listen"
        task = checked.method.startswith("tasks/") or (bool(extensions) and te.declared(checked.capabilities))
        if input_round or listen or task or extensions:
            record.sighting = Sighting(
                checked.client_info,
                checked.version,
                "modern",
                input_round=input_round,
                listen=listen,
                task=task,
                extensions=extension_ids(checked.capabilities),
            )
        else:  # one plain request: counted now, no Sighting made for it
            self._clients.seen_plain(checked.client_info, checked.version, "modern")
        route = self._router[era]
        if route.modern_bytes and checked.method not in CACHEABLE_METHODS and checked.method != "subscriptions/listen":
            return await self._bytes(
                request, "POST", raw, record, legacy=False, message=body, caller=caller, kind="request"
            )
        if era is Era.MODERN:  # same era: the request goes on with the headers it brought
            caller = self._access.same_era(request, caller)
        # A retry of a call parked on a legacy upstream is served where the call is parked;
        # tasks/update and tasks/cancel act on the task's call: served by the replica running it.
        request_state = params.get("requestState") is not None
        topics = modern_topics(checked.method, legacy_upstream=era is Era.LEGACY, request_state=request_state)
        decision = await self._steering.decide(topics, body, caller.principal) if topics else LOCAL
        if isinstance(decision, Replay):
            replayed = await self._steering.replay(request, raw, decision, request_id=body["id"])
            if replayed is not None:
                return replayed
        if checked.method == "subscriptions/listen":
            return await self._listen(request, route.modern.listen(checked, caller), body["id"])
        async with RequestReply(request, self._keepalive_s) as reply:
            try:
                message, status = await route.modern.handle(checked, reply, caller)
            except ProxyError as exc:
                record.outcome = exc.outcome
                if not await reply.streaming():
                    raise
                message, status = exc.reply(body["id"]), 200
            if "error" in message:
                record.outcome = "error" if status == 200 else "rejected"
                record.error_code = error_code(message)
            return await reply.finish(message, status)

    async def _modern_notification(
        self, request: web.Request, raw: bytes, body: dict[str, Any], record: Record, era: Era, caller: Caller
    ) -> web.StreamResponse:
        """202 for a modern client's notification. A core one has nothing to act on here (over
        HTTP a closed stream cancels, docs/translation.md §4.1 row 4); an extension's goes on to
        the server (§2.1): byte for byte to a modern HTTP server, translated otherwise."""
        route = self._router[era]
        if body.get("method") in CORE_CLIENT_NOTIFICATIONS:
            return web.Response(status=202)
        if route.modern_bytes:
            return await self._bytes(request, "POST", raw, record, legacy=False, message=body, caller=caller)
        if era is Era.MODERN:
            caller = self._access.same_era(request, caller)
        await route.modern.notify(body, caller)
        return web.Response(status=202)

    async def _listen(
        self, request: web.Request, messages: AsyncGenerator[dict[str, Any], None], request_id: Any
    ) -> web.StreamResponse:
        """One subscriptions/listen stream, whoever serves it: refused before its first message as
        a plain error reply, a stream of its messages after."""
        try:
            first = await anext(messages)
        except StopAsyncIteration:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, "the listen stream ended before it began") from None
        sse = SseStream(request, self._keepalive_s)
        gauge = self._metrics.streams_open.labels("downstream_listen")
        gauge.inc()
        try:
            await sse.send(first)
            async for message in messages:
                await sse.send(message)
        except ProxyError as exc:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await sse.send(exc.reply(request_id))
        except (ConnectionError, RuntimeError):
            pass  # the client went away: closing the listen below cancels it upstream
        finally:
            gauge.dec()
            sse.abort()
            await messages.aclose()
        return await sse.close()

    # ------------------------------------------------------------ same era, byte for byte

    async def _bytes(
        self,
        request: web.Request,
        method: str,
        raw: bytes | None,
        record: Record,
        *,
        legacy: bool,
        message: Any = None,
        caller: Caller | None = None,
        kind: str | None = None,
    ) -> web.StreamResponse:
        """`caller`: as identified already for this request (a POST's), else identified here;
        `kind`: the message's jsonrpc.kind, if known."""
        relay = self._router.byte_relay
        assert relay is not None, "byte for byte needs an HTTP upstream"
        if caller is None:
            caller = await self._access.caller(request, same_era=True, legacy=legacy)
        else:
            caller = self._access.same_era(request, caller, legacy=legacy)
        # The principal binds what the upstream hands out when the relay has a binding (resource_server).
        forwarded, principal = caller.forwarded, caller.principal
        forward = relay.forward(method, raw, forwarded, legacy=legacy, message=message, principal=principal, kind=kind)
        response, record.outcome = await relay_reply(request, forward)
        return response

    # ------------------------------------------------------------ GET / DELETE

    async def _legacy_host(self, request: web.Request, method: str) -> SessionHost | web.StreamResponse:
        """Who holds the session a GET or DELETE names, or the reply already made for it."""
        try:
            host = self._router[await self._era(request)].legacy
            if host is None:
                return await self._bytes(request, method, None, Record(), legacy=True)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        return host

    # Plain functions: aiohttp awaits the span's own coroutine, so a GET stream held open for hours
    # holds no coroutine level of these.
    def get(self, request: web.Request) -> Awaitable[web.StreamResponse]:
        return self._traced("GET", self._get, request)

    def delete(self, request: web.Request) -> Awaitable[web.StreamResponse]:
        return self._traced("DELETE", self._delete, request)

    async def _traced(
        self, method: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], request: web.Request
    ) -> web.StreamResponse:
        """A GET or DELETE in its span (a GET stream's lasts as long as the stream)."""
        span = self._tracing.downstream(method, request.headers)
        span.begin(None)
        outcome, status = "cancelled", 499
        try:
            response = await handler(request)
            outcome, status = ("ok" if response.status < 400 else "rejected"), response.status
            return response
        finally:
            era = self._detector.known
            span.finish(method, "legacy", era.value if era is not None else "unknown", outcome, status)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return method_not_allowed()
        try:
            self._access.check_headers(request)
            caller = await self._access.caller(request)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        host = await self._legacy_host(request, "GET")
        if not isinstance(host, LegacySessionHost):
            return host
        return await self._legacy.get(request, host, session_id, caller)

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return method_not_allowed()
        try:
            self._access.check_headers(request)
            caller = await self._access.caller(request)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        host = await self._legacy_host(request, "DELETE")
        if not isinstance(host, LegacySessionHost):
            return host
        return await self._legacy.delete(host, session_id, caller)

    # ------------------------------------------------------------ observability

    def _observe(self, record: Record, started: float) -> None:
        elapsed = time.perf_counter() - started
        if record.sighting is not None:
            self._clients.seen(record.sighting)
        if record.span is not NULL_DOWNSTREAM:  # tracing on
            record.span.finish(
                record.method,
                record.downstream_era,
                record.upstream_era,
                record.outcome,
                record.status,
                record.error_code,
            )
        self._metrics.observe_request(
            method_label(record.method), record.downstream_era, record.upstream_era, record.outcome, elapsed
        )
        if not self._log_requests:
            return
        log.info(
            "request",
            method=record.method[:_LOGGED_METHOD_MAX] if isinstance(record.method, str) else None,
            downstream_era=record.downstream_era,
            upstream_era=record.upstream_era,
            outcome=record.outcome,
            status=record.status,
            latency_ms=round(elapsed * 1000, 3),
            session=short_hash(record.session) if record.session else None,
        )


def _batch_problem(batch: list[Any]) -> Rejection | None:
    """The first message of a batch unfit to be relayed, by client_checks.message_problem."""
    for item in batch:
        problem = client_checks.message_problem(item) if isinstance(item, dict) else None
        if problem is not None:
            return problem
    return None
