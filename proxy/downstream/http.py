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
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from ..auth.identity import Identifier, Identity
from ..cluster.forward import Forwarder
from ..cluster.owners import OwnerGone, call_lost
from ..config import Settings
from ..errors import ProxyError, session_not_found
from ..metrics import Metrics, RequestMetrics, method_label
from ..protocol import client_checks, jsonrpc, meta
from ..protocol import task_extension as te
from ..protocol.classify import SESSIONLESS, Route, classify_post
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from ..protocol.methods import CACHEABLE_METHODS, CORE_CLIENT_NOTIFICATIONS
from ..protocol.modern_validate import header_view, validate_request
from ..protocol.status import Rejection
from ..protocol.versions import LEGACY_VERSIONS, Era, legacy_at_least
from ..relay.channel import Caller
from ..relay.detect import EraDetector
from ..relay.failures import UpstreamFailures
from ..relay.legacy_sessions import LegacySessionHost
from ..relay.routes import Router
from ..relay.tasks.host import LegacyTaskHost
from ..state.sealing import Sealer
from ..state.sessions import LegacySession, short_hash
from ..tracing import NO_TRACING, NULL_DOWNSTREAM, DownstreamSpan, Tracing
from .clients import ClientReport, Sighting
from .reply import STARTED, RequestReply, SseStream, end_with_error, error_reply, json_response, relay_reply
from .resume import EventIds, lost_stream_events, open_event_id

log = structlog.get_logger(__name__)
Host = LegacySessionHost[Any]

# Headers carried from the client to the upstream, beside the ones the proxy computes: the trace
# context (meta.TRACE_KEYS) and these.
_PASSTHROUGH_PREFIXES = ("mcp-",)
_SESSION_HEADER_LOWER = SESSION_HEADER.lower()
_STREAM_SCOPED = frozenset({"resources/subscribe", "resources/unsubscribe"})
_TASK_STEERING = frozenset({"tasks/update", "tasks/cancel"})  # a 2026-07-28 client's
_LEGACY_TASK_STEERING = frozenset({"tasks/result", "tasks/cancel"})  # a 2025-11-25 client's
_LOGGED_METHOD_MAX = 200  # characters of a client's method name the access log keeps
_CUT_S = 1.0  # how long the calls cut at shutdown get to answer with their error and end
# The request's Identity, once computed (RequestKey: aiohttp 3.13 and later; a string before).
_IDENTITY: Any = web.RequestKey("identity", Identity) if hasattr(web, "RequestKey") else "mcp_era_proxy.identity"


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
        self._settings = settings
        # Who speaks which protocol (proxy/downstream/clients.py); legacy sessions relayed byte for byte are
        # the upstream's, so their client is remembered here by the session id it handed out.
        self._clients = clients if clients is not None else ClientReport(settings.clients.max_tracked, metrics)
        self._byte_sessions: OrderedDict[str, tuple[object, object]] = OrderedDict()
        self._tasks = tasks  # hosted tasks: a modern client's answer or cancel goes where its task runs
        self._tracing = tracing  # one span per request, parented on its trace context (tracing/__init__.py)
        self._identifier = identifier or Identifier(settings, None)
        # resource_server: the proxy is the token's audience; passing the token on is forbidden.
        self._forward_authorization = settings.upstream.forward_authorization and not self._identifier.resource_server
        self._forwarder = forwarder
        self._sealer = sealer  # event ids on legacy POST streams (downstream/resume.py)
        self._boot = boot
        self._metrics = metrics
        self._detector = detector
        self._router = router
        self._failures = failures
        self._keepalive_s = settings.streams.keepalive_s
        self._max_depth = settings.security.max_json_depth
        # Headers whose value the proxy hashes (the caller's identity) or writes into JSON (trace
        # context in `_meta`), lower-cased. The others it only compares or relays as they came.
        self._text_headers = frozenset(
            {"authorization", *meta.TRACE_KEYS, (settings.security.identity_header or "authorization").lower()}
        )
        self._request_metrics = RequestMetrics(metrics)
        # POSTs being handled, each with the event its end sets (drain waits on them), and those
        # cut at shutdown: their cancellation is the proxy's, answered with SHUTTING_DOWN.
        self._posts: dict[asyncio.Task[Any], asyncio.Event] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        # The access log line is built (and the session id hashed) only when info is logged.
        self._log_requests = logging.getLevelNamesMapping()[settings.logging.level.upper()] <= logging.INFO

    async def _era(self, request: web.BaseRequest) -> Era:
        era = self._detector.known
        if era is not None:
            return era
        # Probed with the caller's Authorization when it may go upstream: a protected upstream
        # refuses an anonymous probe, and its 401 (challenge rewritten) starts the client's OAuth.
        authorization = request.headers.get("Authorization") if self._forward_authorization else None
        credentials = {"Authorization": authorization} if authorization else {}
        return await self._failures.reaching(self._detector.current(credentials))

    # ------------------------------------------------------------ caller context

    def _check_headers(self, request: web.BaseRequest) -> None:
        """aiohttp decodes header bytes that are not UTF-8 with surrogate escapes; such a value
        cannot be hashed or written as JSON, so it is refused in a header the proxy reads so."""
        for name, value in request.headers.items():
            if not value.isascii() and name.lower() in self._text_headers and not _is_utf8(value):
                raise ProxyError(
                    jsonrpc.INVALID_REQUEST, f"Invalid Request: header {name} is not valid UTF-8", refused=True
                )

    async def _caller(self, request: web.BaseRequest, *, same_era: bool = False, legacy: bool = False) -> Caller:
        """Who calls; `same_era`: the request goes upstream as it came, with the headers it brought.

        The caller is identified once per request (proxy/auth/identity.py); in resource_server
        mode that refuses a request without a valid token (401/403), and the client's
        Authorization is never among what goes upstream: upstream.headers carry the proxy's own."""
        identity: Identity | None = request.get(_IDENTITY)
        if identity is None:
            identity = request[_IDENTITY] = await self._identifier.identify(request)
        headers = request.headers
        credentials: dict[str, str] = {}
        if self._forward_authorization and "Authorization" in headers:
            credentials["Authorization"] = headers["Authorization"]
        for name in meta.TRACE_KEYS:
            if name in headers:
                credentials[name] = headers[name]
        return Caller(identity.principal, credentials, _forwarded(request, credentials, legacy) if same_era else {})

    # ------------------------------------------------------------ POST

    async def post(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        record = _Record(self._tracing.downstream("POST", request.headers))
        task = asyncio.current_task()
        ended = asyncio.Event()
        if task is not None:
            self._posts[task] = ended
        try:
            try:
                response = await self._post(request, record)
            except ProxyError as exc:
                record.outcome = exc.outcome if exc.outcome != "error" else "rejected"
                record.error_code = exc.code
                response = error_reply(exc, Era(record.downstream_era), record.request_id)
            except asyncio.CancelledError:
                if task is None or task not in self._cut:
                    record.outcome = "cancelled"
                    record.status = 499  # client closed the connection
                    self._observe(record, started)
                    raise
                task.uncancel()  # the proxy's own cancellation: the client is still there
                response = await self._cut_reply(request, record)
        finally:
            ended.set()
            if task is not None:
                self._posts.pop(task, None)
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
        waits = [asyncio.ensure_future(self._posts[task].wait()) for task in tasks if task in self._posts]
        if waits:
            await asyncio.wait(waits, timeout=within_s)
        for wait in waits:
            wait.cancel()

    async def _cut_reply(self, request: web.Request, record: _Record) -> web.StreamResponse:
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

    async def _post(self, request: web.Request, record: _Record) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProxyError(jsonrpc.INVALID_REQUEST, "request body too large", status=413) from None
        except web.RequestPayloadError as exc:  # e.g. a Content-Encoding the body does not follow
            raise ProxyError(
                jsonrpc.PARSE_ERROR, f"Parse error: the body cannot be read ({_reason(exc)})", refused=True
            ) from None
        try:
            body = jsonrpc.decode(raw)
        except jsonrpc.DecodeError:
            raise ProxyError(jsonrpc.PARSE_ERROR, "Parse error: body is not valid JSON", refused=True) from None
        record.request_id = jsonrpc.id_of(body)
        record.method = _method_of(body)
        record.span.begin(body)  # before any upstream exchange: theirs are its children
        self._check_headers(request)
        # Before anything reaches the upstream (era detection included): refused here in
        # resource_server mode without a valid token.
        await self._caller(request)
        if client_checks.too_deep(body, self._max_depth, raw):
            raise ProxyError.rejected(client_checks.depth_rejection(self._max_depth))
        session_id = request.headers.get(SESSION_HEADER)
        route = classify_post(body, session_id, request.headers.get(PROTOCOL_VERSION_HEADER))
        if isinstance(route, Rejection):
            raise ProxyError.rejected(route)
        if route is not Route.MODERN:
            for item in body if isinstance(body, list) else (body,):
                problem = client_checks.message_problem(item) if isinstance(item, dict) else None
                if problem is not None:
                    raise ProxyError.rejected(problem)
        era = await self._era(request)
        record.upstream_era = era.value
        if route is Route.MODERN:
            record.downstream_era = "modern"
            return await self._modern(request, raw, body, record, era)
        host = self._router[era].legacy
        if host is None:  # legacy client, legacy HTTP upstream: the upstream's own session
            if any(jsonrpc.kind(item) == "invalid" for item in (body if isinstance(body, list) else [body])):
                raise ProxyError(jsonrpc.INVALID_REQUEST, "not a valid JSON-RPC 2.0 message", refused=True)
            response = await self._bytes(request, "POST", raw, record, legacy=True, message=body)
            self._byte_session_sighting(record, body, session_id, response)
            return response
        if route is Route.LEGACY_SESSIONLESS:
            raise ProxyError.rejected(SESSIONLESS)
        caller = await self._caller(request)
        if route is Route.LEGACY_INITIALIZE:
            return await self._initialize(host, body, caller, record)
        assert session_id is not None  # session-less legacy messages were refused above
        session = await self._session(request, host, session_id, caller)
        record.session = session.id
        record.sighting = _legacy_sighting(body, session.client_info, session.legacy_version)
        if route is Route.LEGACY_BATCH:
            return await self._batch(request, host, session, body, caller, record)
        return await self._legacy_message(request, host, session, body, caller, record, raw)

    # ------------------------------------------------------------ legacy clients

    async def _initialize(
        self, host: Host, body: dict[str, Any], caller: Caller, record: _Record
    ) -> web.StreamResponse:
        record.method = "initialize"
        if jsonrpc.kind(body) != "request":
            raise ProxyError(jsonrpc.INVALID_REQUEST, "initialize must be a JSON-RPC request", refused=True)
        try:
            result, session_id = await host.initialize(body, caller.principal, caller.credentials)
        except ProxyError as exc:
            record.outcome = exc.outcome
            record.error_code = exc.code
            return error_reply(exc, Era.LEGACY, body["id"])
        record.session = session_id
        params = jsonrpc.params_of(body)
        record.sighting = Sighting(
            params.get("clientInfo"),
            result.get("protocolVersion"),
            "legacy",
            opened_session=True,
            extensions=_extension_ids(params.get("capabilities")),
        )
        return json_response(jsonrpc.result_response(body["id"], result), headers={SESSION_HEADER: session_id})

    async def _session(self, request: web.BaseRequest, host: Host, session_id: str, caller: Caller) -> LegacySession:
        session = await host.resolve(session_id, caller.principal)
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
        host: Host,
        session: LegacySession,
        body: dict[str, Any],
        caller: Caller,
        record: _Record,
        raw: bytes,
    ) -> web.StreamResponse:
        kind = jsonrpc.kind(body)
        record.method = body.get("method") if kind != "response" else "response"
        if kind == "invalid":
            raise ProxyError(jsonrpc.INVALID_REQUEST, "not a valid JSON-RPC 2.0 message", refused=True)
        if kind == "notification":
            await host.handle_notification(session, body)
            return web.Response(status=202)
        if kind == "response":
            await self._answer(request, host, session, body)
            return web.Response(status=202)
        gone: str | None = None  # a stream holder found gone
        if body["method"] in _STREAM_SCOPED and self._forwarder is not None:
            owner = self._forwarder.stream_owner(session.stream_owner)
            if owner is not None:
                # What the session's GET stream is fed from (its upstream listen) lives on the
                # replica holding the stream: the subscription changes there.
                try:
                    return await self._forwarder.replay(request, raw, owner, kind="subscribe")
                except OwnerGone:
                    gone = owner.boot  # that replica is gone: the change is made here, for the stream's next home
        if body["method"] in _LEGACY_TASK_STEERING:
            # A hosted task's tasks/result (where its input requests come) and tasks/cancel (which
            # stops its call) are served by the replica running the call.
            replayed = await self._to_task_runner(request, raw, session.principal, body)
            if replayed is not None:
                return replayed
        async with RequestReply(request, self._keepalive_s, self._event_ids(session, body["id"])) as reply:
            message = await self._run(host, session, body, reply, caller, record)
            if body["method"] in _STREAM_SCOPED and self._forwarder is not None and message and "result" in message:
                # Made here; a GET stream that opened elsewhere meanwhile must learn of it too.
                holder = self._forwarder.stream_owner(await host.stream_holder(session))
                if holder is not None and holder.boot != gone:
                    await self._forwarder.deliver(request, body, holder, kind="subscribe")
            return await reply.finish(message)

    async def _to_task_runner(
        self, request: web.Request, raw: bytes, principal: str, message: dict[str, Any], request_id: Any = None
    ) -> web.StreamResponse | None:
        """A request about a hosted task whose call runs on another replica, replayed there; None:
        it is served here (the call runs here, the task is not the caller's, or that replica is
        gone: the record answers)."""
        if self._forwarder is None or self._tasks is None:
            return None
        owner = self._forwarder.stream_owner(await self._tasks.runner_of(principal, message))
        if owner is None:
            return None
        with contextlib.suppress(OwnerGone):
            return await self._forwarder.replay(request, raw, owner, kind="task", request_id=request_id)
        return None

    async def _answer(self, request: web.Request, host: Host, session: LegacySession, message: dict[str, Any]) -> None:
        """A legacy client's answer to a server-to-client request: to whoever awaits it, here or
        on the replica that sent the request (its id names it). The client gets 202 either way:
        an answer nobody awaits any more is dropped, as the spec has it."""
        forwarder = self._forwarder
        owner = forwarder.request_owner(message.get("id"), session.id) if forwarder else None
        if owner is not None and forwarder is not None and await forwarder.deliver(request, message, owner):
            return
        if await host.handle_response(session, message):
            return
        # Nothing awaits it here: its round may have been taken over after its replica died (or
        # will be, and the answer is kept for it).
        claimant = await host.offer_answer(session, message)
        target = forwarder.stream_owner(claimant) if forwarder is not None and claimant else None
        if target is not None and forwarder is not None:
            await forwarder.deliver(request, message, target)
        elif not (claimant and await host.handle_response(session, message)) and claimant is None:
            log.info("unexpected_response", session=short_hash(session.id), id=message.get("id"))

    def _event_ids(self, session: LegacySession, request_id: Any) -> EventIds | None:
        if self._sealer is None:
            return None
        prime = legacy_at_least(session.legacy_version, "2025-11-25")
        return EventIds(self._sealer, session.id, request_id, self._boot, prime=prime)

    async def _run(
        self,
        host: Host,
        session: LegacySession,
        body: dict[str, Any],
        reply: RequestReply,
        caller: Caller,
        record: _Record,
    ) -> dict[str, Any] | None:
        """One legacy request; returns the final message (None: the client cancelled it)."""
        try:
            message = await host.handle_request(session, body, reply, caller.credentials)
        except ProxyError as exc:
            record.outcome = exc.outcome
            record.error_code = exc.code
            # A batch shares `reply`: only an error that needs its own HTTP status stops it opening.
            if exc.status_for(Era.LEGACY) != 200 and not await reply.streaming():
                raise  # e.g. an upstream 401: relayed with its status and WWW-Authenticate
            return exc.reply(body["id"])
        if message is None:
            record.outcome = "cancelled"
        elif "error" in message:
            record.outcome = "error"
            record.error_code = _error_code(message)
        return message

    async def _batch(
        self,
        request: web.Request,
        host: Host,
        session: LegacySession,
        body: list[Any],
        caller: Caller,
        record: _Record,
    ) -> web.StreamResponse:
        """JSON-RPC batches exist only in 2025-03-26 (docs/translation.md §7.1)."""
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
                await host.handle_notification(session, item)
            elif kind == "response":
                await self._answer(request, host, session, item)
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
                        group.create_task(self._run(host, session, item, reply, caller, _Record())) for item in requests
                    ]
            except* ProxyError as failed:
                raise failed.exceptions[0] from None
            finals = [final for task in items if (final := task.result()) is not None]
            if not await reply.streaming():
                return json_response(finals)
            for final in finals:
                await reply.send(final)
            return await reply.stream.close()

    # ------------------------------------------------------------ modern clients

    async def _modern(
        self, request: web.Request, raw: bytes, body: Any, record: _Record, era: Era
    ) -> web.StreamResponse:
        """Validate exactly as a 2026-07-28 server must, then translate or relay it."""
        kind = jsonrpc.kind(body)
        if kind == "notification":
            return await self._modern_notification(request, raw, body, record, era)
        if kind != "request":
            raise ProxyError(
                jsonrpc.INVALID_REQUEST, "expected a single JSON-RPC request or notification", refused=True
            )
        problem = client_checks.message_problem(body)
        if problem is not None:
            raise ProxyError.rejected(problem)
        checked = validate_request(body, header_view(request.headers.items()))
        if isinstance(checked, Rejection):
            raise ProxyError.rejected(checked)
        params = jsonrpc.params_of(body)
        record.sighting = Sighting(
            checked.client_info,
            checked.version,
            "modern",
            input_round="inputResponses" in params,
            listen=checked.method == "subscriptions/listen",
            task=checked.method.startswith("tasks/") or te.declared(checked.capabilities),
            extensions=_extension_ids(checked.capabilities),
        )
        route = self._router[era]
        if route.modern_bytes and checked.method not in CACHEABLE_METHODS and checked.method != "subscriptions/listen":
            return await self._bytes(request, "POST", raw, record, legacy=False, message=body)
        caller = await self._caller(request, same_era=era is Era.MODERN)
        state = jsonrpc.params_of(body).get("requestState") if era is Era.LEGACY else None
        if state is not None and self._forwarder is not None:
            # A retry of a call parked on a legacy upstream: served where the call is parked.
            owner = self._forwarder.state_owner(state, caller.principal)
            if owner is not None:
                try:
                    return await self._forwarder.replay(request, raw, owner, kind="resume", request_id=body["id"])
                except OwnerGone:
                    lost = call_lost()
                    raise ProxyError(lost["code"], lost["message"], data=lost["data"]) from None
        if checked.method in _TASK_STEERING and era is Era.LEGACY:
            # tasks/update and tasks/cancel act on the task's call: served by the replica running it.
            replayed = await self._to_task_runner(request, raw, caller.principal, body, request_id=body["id"])
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
                record.error_code = _error_code(message)
            return await reply.finish(message, status)

    async def _modern_notification(
        self, request: web.Request, raw: bytes, body: dict[str, Any], record: _Record, era: Era
    ) -> web.StreamResponse:
        """202 for a modern client's notification. A core one has nothing to act on here (over
        HTTP a closed stream cancels, docs/translation.md §4.1 row 4); an extension's goes on to
        the server (§2.1): byte for byte to a modern HTTP server, translated otherwise."""
        route = self._router[era]
        if body.get("method") in CORE_CLIENT_NOTIFICATIONS:
            return web.Response(status=202)
        if route.modern_bytes:
            return await self._bytes(request, "POST", raw, record, legacy=False, message=body)
        caller = await self._caller(request, same_era=era is Era.MODERN)
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
        record: _Record,
        *,
        legacy: bool,
        message: Any = None,
    ) -> web.StreamResponse:
        relay = self._router.byte_relay
        assert relay is not None, "byte for byte needs an HTTP upstream"
        caller = await self._caller(request, same_era=True, legacy=legacy)
        # The principal binds what the upstream hands out when the relay has a binding (resource_server).
        forwarded, principal = caller.forwarded, caller.principal
        forward = relay.forward(method, raw, forwarded, legacy=legacy, message=message, principal=principal)
        response, record.outcome = await relay_reply(request, forward)
        return response

    # ------------------------------------------------------------ GET / DELETE

    async def _legacy_host(self, request: web.Request, method: str) -> Host | web.StreamResponse:
        """Who holds the session a GET or DELETE names, or the reply already made for it."""
        try:
            host = self._router[await self._era(request)].legacy
            if host is None:
                return await self._bytes(request, method, None, _Record(), legacy=True)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        return host

    async def get(self, request: web.Request) -> web.StreamResponse:
        return await self._traced("GET", self._get, request)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        return await self._traced("DELETE", self._delete, request)

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
            return _method_not_allowed()
        try:
            self._check_headers(request)
            caller = await self._caller(request)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        host = await self._legacy_host(request, "GET")
        if not isinstance(host, LegacySessionHost):
            return host
        try:
            session = await self._session(request, host, session_id, caller)
            last_event_id = request.headers.get("Last-Event-ID")
            if last_event_id is not None:
                return await self._resume(request, host, session, last_event_id)
            stream_handle = await host.open_get_stream(session, caller.credentials)
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
            host.close_get_stream(session.id, stream_handle)
            sse.abort()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await sse.close()
        return sse.response or web.Response(status=204)

    async def _resume(
        self, request: web.Request, host: Host, session: LegacySession, last_event_id: str
    ) -> web.StreamResponse:
        """A client whose POST stream broke resumes it (downstream/resume.py): the request's input
        round carried on here if one was open, else its error."""
        resumed = open_event_id(self._sealer, session.id, last_event_id) if self._sealer is not None else None
        if resumed is None:
            raise ProxyError(
                jsonrpc.INVALID_REQUEST,
                "Last-Event-ID does not name a stream of this session",
                status=400,
                outcome="rejected",
            )
        caller = await self._caller(request)
        async with RequestReply(request, self._keepalive_s, self._event_ids(session, resumed.request_id)) as reply:
            stream = reply.stream
            await stream.start()  # an SSE stream whatever comes: the client resumes one
            try:
                message = await host.resume(session, resumed.request_id, resumed.seq, reply, caller.credentials)
            except ProxyError as exc:
                message = exc.reply(resumed.request_id)
            outcome = "continued" if message is not None else "lost"
            self._metrics.streams_resumed.labels(outcome).inc()
            log.info("stream_resumed", session=short_hash(session.id), outcome=outcome, seq=resumed.seq)
            with contextlib.suppress(ConnectionError, RuntimeError):
                if message is not None:
                    await stream.send(message)
                else:
                    await stream.write(lost_stream_events(resumed, self._boot))
            return await stream.close()

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return _method_not_allowed()
        try:
            self._check_headers(request)
            caller = await self._caller(request)
        except ProxyError as exc:
            return error_reply(exc, Era.LEGACY)
        host = await self._legacy_host(request, "DELETE")
        if not isinstance(host, LegacySessionHost):
            return host
        session = await host.resolve(session_id, caller.principal)
        if session is None:
            return error_reply(session_not_found(), Era.LEGACY)
        await host.close(session.id, reason="deleted")
        return web.Response(status=200)

    # ------------------------------------------------------------ observability

    def _byte_session_sighting(
        self, record: _Record, body: Any, session_id: str | None, response: web.StreamResponse
    ) -> None:
        """A legacy client of a legacy HTTP server: its initialize names it; the session id the
        server handed out names it afterwards (bounded: the oldest sessions are forgotten)."""
        if isinstance(body, dict) and body.get("method") == "initialize":
            params = jsonrpc.params_of(body)
            client = (params.get("clientInfo"), params.get("protocolVersion"))
            handed_out = response.headers.get(SESSION_HEADER)
            if handed_out:
                self._byte_sessions[handed_out] = client
                while len(self._byte_sessions) > _BYTE_SESSIONS_KEPT:
                    self._byte_sessions.popitem(last=False)
            caps = params.get("capabilities")
            record.sighting = Sighting(*client, "legacy", opened_session=True, extensions=_extension_ids(caps))
            return
        known = self._byte_sessions.get(session_id) if session_id is not None else None
        if known is not None:
            self._byte_sessions.move_to_end(session_id)  # type: ignore[arg-type]
            record.sighting = _legacy_sighting(body, *known)

    def _observe(self, record: _Record, started: float) -> None:
        elapsed = time.perf_counter() - started
        if record.sighting is not None:
            self._clients.seen(record.sighting)
        record.span.finish(
            record.method, record.downstream_era, record.upstream_era, record.outcome, record.status, record.error_code
        )
        self._request_metrics.observe(
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


class _Record:
    """What the access log and metrics say about one POST."""

    __slots__ = (
        "downstream_era",
        "error_code",
        "method",
        "outcome",
        "request_id",
        "session",
        "sighting",
        "span",
        "status",
        "upstream_era",
    )

    def __init__(self, span: DownstreamSpan = NULL_DOWNSTREAM) -> None:
        self.span = span  # its trace span (the null one while tracing is off)
        self.error_code: object = None  # the JSON-RPC error code of an error reply
        self.method: Any = None
        self.downstream_era = "legacy"
        self.upstream_era = "unknown"
        self.outcome = "ok"
        self.status = 200
        self.session: str | None = None
        self.request_id: Any = None
        self.sighting: Sighting | None = None  # the client, for the migration report


def _method_of(body: object) -> object:
    """What the access log and metrics call a POST before it is read further."""
    if isinstance(body, list):
        return "batch"
    return body.get("method") if isinstance(body, dict) else None


def _error_code(message: dict[str, Any]) -> object:
    error = message.get("error")
    return error.get("code") if isinstance(error, dict) else None


def _is_utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _reason(exc: BaseException) -> str:
    """aiohttp's payload errors read "400, message:\n  <reason>": the reason."""
    lines = str(exc).strip().splitlines()
    return lines[-1].strip()[:200] if lines else exc.__class__.__name__


def _method_not_allowed() -> web.Response:
    return json_response(
        jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Method not allowed"), 405, {"Allow": "POST"}
    )


def _forwarded(request: web.BaseRequest, credentials: dict[str, str], legacy: bool) -> dict[str, str]:
    """What a same-era request carries upstream: credentials, trace, its Mcp-* headers; for a legacy
    session also its id and Last-Event-ID (it maps one to one onto the upstream's)."""
    headers = dict(credentials)
    for name, value in request.headers.items():
        lowered = name.lower()
        if lowered.startswith(_PASSTHROUGH_PREFIXES):
            if legacy or lowered != _SESSION_HEADER_LOWER:
                headers[name] = value
        elif legacy and lowered == "last-event-id":
            headers[name] = value
    return headers


_BYTE_SESSIONS_KEPT = 10_000  # legacy sessions of a legacy HTTP upstream whose client is known here
_LISTENING = frozenset({"resources/subscribe"})


def _extension_ids(capabilities: object) -> list[str]:
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return [key for key in extensions if isinstance(key, str)] if isinstance(extensions, dict) else []


def _legacy_sighting(body: Any, client_info: object, version: object) -> Sighting:
    """A legacy client's message (or batch) in its session."""
    items = body if isinstance(body, list) else [body]
    first = items[0] if items and isinstance(items[0], dict) else {}
    method = first.get("method")
    return Sighting(
        client_info,
        version,
        "legacy",
        input_round=any(isinstance(i, dict) and "method" not in i for i in items),  # its answers
        listen=method in _LISTENING,
        task=(isinstance(method, str) and method.startswith("tasks/")) or "task" in jsonrpc.params_of(first),
    )
