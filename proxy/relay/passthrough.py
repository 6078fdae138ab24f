"""Modern clients of a modern upstream, message by message (over HTTP, byte for byte is
relay.bytes; legacy clients of a legacy stdio server are relay.connection_sessions).

A stdio server has one channel for everyone, so messages are relayed one by one: unchanged, except
for what sharing the channel requires (unique request ids and progress tokens, mapped back). Over
HTTP the cacheable requests come here too, so the response cache can serve them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import structlog

from ..config import Settings
from ..metrics import Metrics
from ..protocol import jsonrpc, meta
from ..protocol.modern_to_legacy import listen_closed
from ..protocol.modern_validate import ModernRequest
from ..protocol.outcome import Outcome
from ..protocol.parked_call import invalid_state
from ..protocol.status import status_of
from ..protocol.versions import Era
from ..state.cache import ResponseCache
from ..upstream.base import Upstream
from ..upstream.errors import UpstreamError, UpstreamProtocolError, UpstreamUnavailable
from .binding import CallerBinding
from .channel import Caller, ReplyChannel
from .failures import UpstreamFailures, deliver_notification
from .scopes import Deadline

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)


def _with_id(message: JSONDict, request_id: Any) -> JSONDict:
    return {**message, "id": request_id}


def _retag(message: JSONDict, key: str, value: Any) -> JSONDict:
    """Put `value` back under params[key] (progress token) of a notification."""
    params = jsonrpc.params_of(message)
    return {**message, "params": {**params, key: value}}


class ModernPassThrough:
    """Modern clients, modern upstream, message by message: always over stdio; over HTTP only for
    cacheable requests (everything else is relayed byte for byte there)."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        metrics: Metrics,
        cache: ResponseCache | None = None,
        failures: UpstreamFailures | None = None,
        binding: CallerBinding | None = None,
    ) -> None:
        self._settings = settings
        # resource_server: the upstream's requestState is sealed for the caller (relay/binding.py).
        self._binding = binding
        self._upstream = upstream
        self._metrics = metrics
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self._failures = failures if failures is not None else UpstreamFailures(metrics)
        self._ids = itertools.count(1)
        self._ending = asyncio.Event()  # shutdown: listens end with their completion result

    def _outgoing(self, request: ModernRequest) -> tuple[JSONDict, Any, Any]:
        """The request under a channel-unique id (and progress token); returns it, and the originals."""
        message = request.message
        upstream_id = f"m{next(self._ids)}"
        params = jsonrpc.params_of(message)
        downstream_token = (meta.meta_of(params) or {}).get("progressToken")
        if downstream_token is not None:
            params = meta.with_meta(params, "progressToken", f"{upstream_id}-progress")
        return {**message, "id": upstream_id, "params": params}, message["id"], downstream_token

    def _check_answer(self, response: JSONDict, upstream_id: str) -> None:
        """A response on the request's own reply must answer it: under its id, or an error without
        one (the server could not read it). Over stdio the channel routes by id already."""
        request_id = response.get("id")
        if request_id != upstream_id and not (request_id is None and "error" in response):
            raise UpstreamProtocolError(self._upstream.name, f"answered another request (id {request_id!r})")

    def _downstream(self, incoming: JSONDict, downstream_id: Any, downstream_token: Any) -> JSONDict:
        if "method" not in incoming:
            return _with_id(incoming, downstream_id)
        if incoming["method"] == "notifications/progress" and downstream_token is not None:
            return _retag(incoming, "progressToken", downstream_token)
        note_meta = meta.meta_of(incoming.get("params"))
        if note_meta is not None and meta.SUBSCRIPTION_ID in note_meta:
            return {**incoming, "params": meta.with_meta(incoming.get("params"), meta.SUBSCRIPTION_ID, downstream_id)}
        return incoming

    async def notify(self, message: JSONDict, caller: Caller) -> None:
        """A client's notification of an extension, to the server as it is (docs/translation.md
        §2.1). Nothing answers it, so a failure is logged, not reported."""
        headers = dict(caller.forwarded or {})  # the client's own, as its requests go
        within_s = self._settings.upstream.request_timeout_s
        send = self._upstream.send(message, headers)
        await deliver_notification(self._upstream.name, message.get("method"), within_s, send)

    async def handle(self, request: ModernRequest, channel: ReplyChannel, caller: Caller) -> tuple[JSONDict, int]:
        binding = self._binding
        if binding is not None:
            opened = binding.request(request.message, caller.principal)
            if opened is None:
                refusal = invalid_state(request.message["id"])
                return refusal.message, refusal.status
            if opened[1]:
                request = dataclasses.replace(request, message=opened[0])
        reply, status = await self._handle(request, channel, caller)
        if binding is not None:
            reply = binding.reply(reply, caller.principal) or reply
        return reply, status

    async def _handle(self, request: ModernRequest, channel: ReplyChannel, caller: Caller) -> tuple[JSONDict, int]:
        params = jsonrpc.params_of(request.message)
        key = self._cache.key_for(request.method, params, request.version, request.capabilities)
        headers = caller.forwarded
        if key is not None and "requestState" not in params and "inputResponses" not in params:
            outcome = await self._cache.fetch(key, caller.principal, lambda: self._forward(request, channel, headers))
            message = outcome.message
        else:
            message = (await self._forward(request, channel, headers)).message
        reply = {**message, "jsonrpc": "2.0", "id": request.message["id"]}
        return reply, status_of(reply, Era.MODERN)

    async def _forward(
        self, request: ModernRequest, channel: ReplyChannel, headers: Mapping[str, str] | None
    ) -> Outcome:
        outgoing, downstream_id, downstream_token = self._outgoing(request)
        headers = dict(headers or {})
        outgoing = meta.carry_trace(outgoing, headers)
        try:
            with Deadline(self._settings.upstream.request_timeout_s):
                async with self._upstream.exchange(outgoing, headers) as reply:
                    async for incoming in reply:
                        if "method" not in incoming:
                            self._check_answer(incoming, outgoing["id"])
                        out = self._downstream(incoming, downstream_id, downstream_token)
                        if "method" not in incoming:
                            return Outcome(out)
                        if channel.can_stream:
                            await channel.send(out)
        except UpstreamError as exc:
            raise self._failures.client_error(exc) from None
        except TimeoutError:
            raise self._failures.timeout(self._upstream.name) from None
        raise self._failures.client_error(UpstreamUnavailable(self._upstream.name, "ended the request without a reply"))

    async def listen(self, request: ModernRequest, caller: Caller) -> AsyncGenerator[JSONDict, None]:
        """A listen stream, relayed until the client leaves (closing it cancels it upstream) or the
        upstream ends it; at shutdown the proxy ends it with the completion result."""
        outgoing, downstream_id, _ = self._outgoing(request)
        try:
            async with self._upstream.exchange(outgoing, caller.forwarded) as reply:
                async for incoming in _until(reply, self._ending):
                    if incoming is None:  # the proxy is shutting down: end it gracefully
                        yield listen_closed(downstream_id)
                        return
                    if "method" not in incoming:
                        self._check_answer(incoming, outgoing["id"])
                    self._cache.invalidate_for(incoming)
                    out = self._downstream(incoming, downstream_id, None)
                    if "method" not in incoming and isinstance(out.get("result"), dict):
                        out = {**out, "result": meta.with_meta(out["result"], meta.SUBSCRIPTION_ID, downstream_id)}
                    yield out
                    if "method" not in incoming:
                        return
        except UpstreamError as exc:
            raise self._failures.client_error(exc) from None

    def end_streams(self) -> None:
        self._ending.set()


async def _until(messages: Any, ending: asyncio.Event) -> Any:
    """The messages of `messages`, then None as soon as `ending` is set."""
    iterator = aiter(messages)
    stop = asyncio.ensure_future(ending.wait())
    following: asyncio.Future[Any] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({following, stop}, return_when=asyncio.FIRST_COMPLETED)
            if following not in done:
                yield None
                return
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        stop.cancel()
        if following is not None and not following.done():
            following.cancel()
