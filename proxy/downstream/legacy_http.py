"""Legacy clients over Streamable HTTP, in the sessions the proxy holds (relay/legacy_sessions.py):
initialize, each later message (requests, notifications, the client's answers), 2025-03-26
batches, the session's GET stream, a broken POST stream resumed (downstream/resume.py), DELETE.
A message about something another replica owns is served there (downstream/steer.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from aiohttp import web

from ..errors import ProxyError, session_not_found
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from ..protocol.versions import LEGACY_VERSIONS, Era, legacy_at_least
from ..relay.channel import Caller
from ..relay.legacy_sessions import LegacySessionHost
from ..state.sealing import Sealer
from ..state.sessions import LegacySession, short_hash
from .access import Access
from .clients import Sighting
from .messages import Record, error_code, extension_ids
from .replicas import Steering
from .reply import RequestReply, SseStream, error_reply, json_response
from .resume import EventIds, lost_stream_events, open_event_id
from .steer import LOCAL, Replay, Topic, decide, legacy_topics

log = structlog.get_logger(__name__)
SessionHost = LegacySessionHost[Any]  # whichever backend the upstream needs


class LegacyEndpoint:
    def __init__(
        self,
        access: Access,
        steering: Steering,
        metrics: Metrics,
        keepalive_s: float,
        sealer: Sealer | None = None,
        boot: str = "",
    ) -> None:
        self._access = access
        self._steering = steering
        self._metrics = metrics
        self._keepalive_s = keepalive_s
        self._sealer = sealer  # event ids on legacy POST streams (downstream/resume.py)
        self._boot = boot

    # ------------------------------------------------------------ POST

    async def initialize(
        self, host: SessionHost, body: dict[str, Any], caller: Caller, record: Record
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
            extensions=extension_ids(params.get("capabilities")),
        )
        return json_response(jsonrpc.result_response(body["id"], result), headers={SESSION_HEADER: session_id})

    async def session(
        self, request: web.BaseRequest, host: SessionHost, session_id: str, caller: Caller
    ) -> LegacySession:
        session = await host.resolve(session_id, caller.principal)
        if session is None:
            raise session_not_found()
        version = request.headers.get(PROTOCOL_VERSION_HEADER)
        if version is not None and version not in LEGACY_VERSIONS:
            raise ProxyError(
                jsonrpc.INVALID_REQUEST, f"unsupported MCP-Protocol-Version {version!r} for this session", refused=True
            )
        return session

    async def message(
        self,
        request: web.Request,
        host: SessionHost,
        session: LegacySession,
        body: dict[str, Any],
        caller: Caller,
        record: Record,
        raw: bytes,
    ) -> web.StreamResponse:
        kind = jsonrpc.kind(body)
        if kind == "invalid":
            raise ProxyError(jsonrpc.INVALID_REQUEST, "not a valid JSON-RPC 2.0 message", refused=True)
        if kind == "notification":
            await host.handle_notification(session, body)
            return web.Response(status=202)
        if kind == "response":
            await self._answer(request, host, session, body)
            return web.Response(status=202)
        # What the session's GET stream is fed from (its upstream listen) lives on the replica
        # holding the stream: a subscription changes there. A hosted task's tasks/result (where its
        # input requests come) and tasks/cancel (which stops its call) are served by the replica
        # running the call.
        topics = legacy_topics(kind, body["method"])
        # Most messages are about nothing another replica may own: no lookup, no await.
        decision = await self._steering.decide(topics, body, session.principal, session) if topics else LOCAL
        gone: str | None = None  # a stream holder found gone
        if isinstance(decision, Replay):
            replayed = await self._steering.replay(request, raw, decision)
            if replayed is not None:
                return replayed
            gone = decision.owner.boot  # that replica is gone: served here (for the stream's next home)
        async with RequestReply(request, self._keepalive_s, self._event_ids(session, body["id"])) as reply:
            # _run's, inline: one await level less under every suspension of the request.
            try:
                message = _noted(await host.handle_request(session, body, reply, caller.credentials), record)
            except ProxyError as exc:
                message = await _failed(exc, reply, body["id"], record)
            if Topic.SUBSCRIPTION in topics and self._steering.forwarding and message and "result" in message:
                # Made here; a GET stream that opened elsewhere meanwhile must learn of it too.
                holder = self._steering.stream_holder(await host.stream_holder(session))
                tell = decide(topics, {Topic.SUBSCRIPTION: holder}, gone=gone)
                if isinstance(tell, Replay):
                    await self._steering.deliver(request, body, tell)
            return await reply.finish(message)

    async def _answer(
        self, request: web.Request, host: SessionHost, session: LegacySession, message: dict[str, Any]
    ) -> None:
        """A legacy client's answer to a server-to-client request: to whoever awaits it, here or
        on the replica that sent the request (its id names it). The client gets 202 either way:
        an answer nobody awaits any more is dropped, as the spec has it."""
        topics = (Topic.ANSWER,)
        decision = await self._steering.decide(topics, message, session.principal, session)
        if isinstance(decision, Replay) and await self._steering.deliver(request, message, decision):
            return
        if await host.handle_response(session, message):
            return
        # Nothing awaits it here: its round may have been taken over after its replica died (or
        # will be, and the answer is kept for it).
        claimant = await host.offer_answer(session, message)
        taken_over = decide(topics, {Topic.ANSWER: self._steering.stream_holder(claimant)})
        if isinstance(taken_over, Replay):
            await self._steering.deliver(request, message, taken_over)
        elif not (claimant and await host.handle_response(session, message)) and claimant is None:
            log.info("unexpected_response", session=short_hash(session.id), id=message.get("id"))

    def _event_ids(self, session: LegacySession, request_id: Any) -> EventIds | None:
        if self._sealer is None:
            return None
        prime = legacy_at_least(session.legacy_version, "2025-11-25")
        return EventIds(self._sealer, session.id, request_id, self._boot, prime=prime)

    async def _run(
        self,
        host: SessionHost,
        session: LegacySession,
        body: dict[str, Any],
        reply: RequestReply,
        caller: Caller,
        record: Record,
    ) -> dict[str, Any] | None:
        """One legacy request; returns the final message (None: the client cancelled it)."""
        try:
            message = await host.handle_request(session, body, reply, caller.credentials)
        except ProxyError as exc:
            return await _failed(exc, reply, body["id"], record)
        return _noted(message, record)

    async def batch(
        self,
        request: web.Request,
        host: SessionHost,
        session: LegacySession,
        body: list[Any],
        caller: Caller,
        record: Record,
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
                        group.create_task(self._run(host, session, item, reply, caller, Record())) for item in requests
                    ]
            except* ProxyError as failed:
                raise failed.exceptions[0] from None
            finals = [final for task in items if (final := task.result()) is not None]
            if not await reply.streaming():
                return json_response(finals)
            for final in finals:
                await reply.send(final)
            return await reply.stream.close()

    # ------------------------------------------------------------ GET / DELETE

    async def get(self, request: web.Request, host: SessionHost, session_id: str, caller: Caller) -> web.StreamResponse:
        """The session's GET stream (server requests and notifications), or a POST stream resumed."""
        try:
            session = await self.session(request, host, session_id, caller)
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
                message = await stream_handle.get()
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
        self, request: web.Request, host: SessionHost, session: LegacySession, last_event_id: str
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
        caller = await self._access.caller(request)
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

    async def delete(self, host: SessionHost, session_id: str, caller: Caller) -> web.StreamResponse:
        session = await host.resolve(session_id, caller.principal)
        if session is None:
            return error_reply(session_not_found(), Era.LEGACY)
        await host.close(session.id, reason="deleted")
        return web.Response(status=200)


def _noted(message: dict[str, Any] | None, record: Record) -> dict[str, Any] | None:
    """A request's final message (None: the client cancelled it), its outcome noted."""
    if message is None:
        record.outcome = "cancelled"
    elif "error" in message:
        record.outcome = "error"
        record.error_code = error_code(message)
    return message


async def _failed(exc: ProxyError, reply: RequestReply, request_id: Any, record: Record) -> dict[str, Any]:
    """A request that failed with `exc`: its error reply, its outcome noted; raises `exc` again when
    it needs an HTTP status of its own and the reply is not a stream yet."""
    record.outcome = exc.outcome
    record.error_code = exc.code
    # A batch shares `reply`: only an error that needs its own HTTP status stops it opening.
    if exc.status_for(Era.LEGACY) != 200 and not await reply.streaming():
        raise exc  # e.g. an upstream 401: relayed with its status and WWW-Authenticate
    return exc.reply(request_id)
