"""Same era on both sides over HTTP: the request's bytes go upstream unchanged and the reply's
bytes come back unchanged. A legacy session maps one to one onto the upstream's (its id and
Last-Event-ID pass through).

In `auth.mode: resource_server` two things are rewritten, as the upstream cannot tell callers
apart there (relay/binding.py): a legacy session id, and a modern upstream's `requestState`, reach
the client sealed for its caller and go back upstream as the upstream's own.

Unchanged, but not unchecked (protocol/relayed_reply.py): a whole reply is read (up to
`upstream.max_reply_bytes`) and parsed once before the client gets it, an SSE reply is relayed
event by event as each is complete and checked; what is no answer to the request (an HTML error
page, a body that is not JSON-RPC, a response to another id) becomes the client's JSON-RPC error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from .. import tracing
from ..errors import ProxyError, session_not_found
from ..protocol import jsonrpc, relayed_reply
from ..protocol.detection import MODERN_REFUSAL, refused_as_modern
from ..protocol.headers import SESSION_HEADER
from ..protocol.outcome import UpstreamFailure
from ..protocol.parked_call import invalid_state
from ..protocol.relayed_reply import EventCheck, Sent
from ..upstream.errors import UpstreamError, UpstreamUnavailable
from ..upstream.http import FOLLOWED, HttpReply, HttpUpstream
from .binding import CallerBinding
from .failures import UpstreamFailures
from .scopes import Deadline

log = structlog.get_logger(__name__)

_RETURNED = ("Content-Type", "WWW-Authenticate", "Allow")
_RETURNED_LEGACY = (*_RETURNED, SESSION_HEADER)  # a legacy session is the upstream's own
_KEPT_ON_REFUSAL = ("WWW-Authenticate", "Allow")  # what still matters when the body is replaced
_SESSION_LOWER = SESSION_HEADER.lower()


@dataclass(slots=True)
class ByteReply:
    """The upstream's reply: its status, the headers the client gets, and either its whole body
    (checked) or, for an SSE stream, its bytes as they arrive (`chunks`, checked as they pass)."""

    status: int
    headers: dict[str, str]
    body: bytes | None
    chunks: AsyncIterator[bytes] | None = None
    check: EventCheck | None = None

    @property
    def unanswered(self) -> Collection[Any]:
        """The ids of the requests a stream has not answered so far: if it fails now, each gets
        the failure as its error."""
        return self.check.unanswered if self.check is not None else ()


class ByteRelay:
    def __init__(
        self,
        upstream: HttpUpstream,
        failures: UpstreamFailures,
        request_timeout_s: float,
        binding: CallerBinding | None = None,
        *,
        on_era_mismatch: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`on_era_mismatch(reason)`: a legacy client's initialize was refused as only a 2026-07-28
        server refuses it (era re-detection)."""
        self._upstream = upstream
        self._failures = failures
        self._request_timeout_s = request_timeout_s
        self.binding = binding  # resource_server mode: what the upstream hands out is bound to the caller
        self._on_era_mismatch = on_era_mismatch

    def forward(
        self,
        method: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        legacy: bool,
        message: Any = None,
        principal: str | None = None,
        kind: str | None = None,
    ) -> _Forward:
        """Relay one request (`message`: its body, decoded; `kind`: its jsonrpc.kind, if known);
        entering yields the reply, leaving closes it. A failure to reach the upstream, or a reply
        that is no answer, is the client's ProxyError (raised on entering, or by the chunks of a
        stream). A POST is bounded by the request timeout, body included; GET streams are not.
        With a binding, `principal` is the caller's: a session id or requestState not sealed for it
        is refused here (ProxyError), before anything reaches the upstream."""
        in_session = legacy and any(name.lower() == _SESSION_LOWER for name in headers)
        binding = self.binding if principal is not None else None
        if binding is not None and principal is not None:
            if in_session:
                headers = _unsealed_session(binding, headers, principal)
            elif not legacy:
                opened = binding.request(message, principal)
                if opened is None:
                    refusal = invalid_state(message["id"])  # a validated modern request
                    error = refusal.message["error"]
                    raise ProxyError(
                        error["code"], error["message"], status=refusal.status, refused=True, outcome="rejected"
                    )
                message, changed = opened
                if changed:
                    body = jsonrpc.encode(message)
        sent = Sent.of(method, message, legacy=legacy, in_session=in_session, kind=kind)
        return _Forward(self, method, body, headers, legacy, sent, message, principal if binding else None)

    def refuse(
        self, failure: UpstreamFailure, status: int | None = None, headers: dict[str, str] | None = None
    ) -> ProxyError:
        """The client's error for a reply that is no answer, logged and counted like any failure."""
        log.warning("upstream_failed", upstream=failure.upstream, error=failure.detail)
        return self._failures.client_error(failure, status=status, headers=headers)

    def _reply(
        self,
        response: HttpReply,
        sent: Sent,
        legacy: bool,
        principal: str | None,
        initialize: bool = False,
        body: bytes | None = None,
    ) -> ByteReply | None:
        """The reply to relay; None when its whole body is wanted and has not all arrived: then it
        is asked again with `body`, read (HttpUpstream.read_body). Not a coroutine: the usual body
        has arrived with the head, and the request is spared an await level."""
        upstream = self._upstream
        headers = response.headers
        returned = {}  # a loop, not a comprehension: that is a function call per request
        for name in _RETURNED_LEGACY if legacy else _RETURNED:
            value = headers.get(name)
            if value is not None:
                returned[name] = value
        binding = self.binding if principal is not None else None
        rewrite: relayed_reply.Rewrite | None = None
        if binding is not None and principal is not None:
            if SESSION_HEADER in returned:
                returned[SESSION_HEADER] = binding.seal_session(returned[SESSION_HEADER], principal)
            if not legacy:

                def rewrite(value: Any) -> Any:
                    return binding.reply(value, principal)

        status = response.status
        if status in (401, 403) and self._failures.own_credentials:
            # The proxy's own credentials refused (resource_server): the client gets a 502, not the challenge.
            detail = f"answered HTTP {status}"
            raise self.refuse(UpstreamFailure(upstream.name, "http", jsonrpc.UPSTREAM_UNAVAILABLE, detail, status))
        content_type = headers.get("Content-Type", "")
        if content_type != "application/json":  # the usual, already a bare media type in lower case
            content_type = content_type.split(";")[0].strip().lower()
            if relayed_reply.streams(status, content_type):  # never a JSON reply
                check = EventCheck(sent, upstream.name, upstream.max_reply_bytes, rewrite)
                return ByteReply(status, returned, None, _Events(self, response.content, check), check)
        if body is None:
            body = upstream.arrived_body(response)
            if body is None:  # not all here yet
                return None
        if rewrite is None:
            refusal = relayed_reply.check_body(sent, status, content_type, body, upstream.name)
        else:
            refusal, body = relayed_reply.check_and_rewrite(sent, status, content_type, body, upstream.name, rewrite)
        if refusal is not None:
            kept = {name: value for name, value in returned.items() if name in _KEPT_ON_REFUSAL}
            raise self.refuse(refusal.failure, refusal.status, kept)
        if initialize and status >= 400:
            self._check_era(body)
        return ByteReply(status, returned, body)

    def _check_era(self, body: bytes) -> None:
        """A refused initialize (rare: parsed once more) that names 2026-07-28 versions, or an
        error only a 2026-07-28 server sends: the upstream is not the legacy one configured."""
        try:
            error = jsonrpc.obj(jsonrpc.decode(body)).get("error")
        except jsonrpc.DecodeError:
            return
        if refused_as_modern(error):
            self._on_era_mismatch(MODERN_REFUSAL)


def _unsealed_session(binding: CallerBinding, headers: Mapping[str, str], principal: str) -> dict[str, str]:
    """The headers with the upstream's own session id in place of the one sealed for the caller;
    a session id not sealed for this caller is no session of theirs (404, like any unknown one)."""
    unsealed: dict[str, str] = {}
    for name, value in headers.items():
        if name.lower() == _SESSION_LOWER:
            opened = binding.open_session(value, principal)
            if opened is None:
                raise session_not_found()
            value = opened
        unsealed[name] = value
    return unsealed


class _Events:
    """The bytes of an SSE reply's whole events as they arrive, each event checked; a failure (the
    stream broke, an event is invalid or too large) is raised as the client's ProxyError once the
    events before it are out. A plain iterator: no async generator to finalize per request."""

    __slots__ = ("_check", "_content", "_failed", "_relay")

    def __init__(self, relay: ByteRelay, content: aiohttp.StreamReader, check: EventCheck) -> None:
        self._relay = relay
        self._content = content
        self._check = check
        self._failed: ProxyError | None = None

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._failed is not None:
                raise self._failed
            try:
                chunk = await self._content.readany()
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                name = self._relay._upstream.name
                raise self._relay.refuse(
                    UpstreamUnavailable(name, f"dropped the stream ({exc.__class__.__name__})").failure
                ) from None
            if not chunk:
                ended = self._check.ended()
                if ended is not None:
                    raise self._relay.refuse(ended)
                raise StopAsyncIteration
            data, failure = self._check.feed(chunk)
            if failure is not None:
                self._failed = self._relay.refuse(failure)
            if data:
                return data


class _Forward:
    """One relayed request (a class, not a generator: it runs once per request)."""

    __slots__ = (
        "_body",
        "_deadline",
        "_headers",
        "_legacy",
        "_message",
        "_method",
        "_principal",
        "_relay",
        "_response",
        "_sent",
        "_span",
    )

    _response: HttpReply  # set on entering, as is _span
    _span: tracing.UpstreamSpan

    def __init__(
        self,
        relay: ByteRelay,
        method: str,
        body: bytes | None,
        headers: Mapping[str, str],
        legacy: bool,
        sent: Sent,
        message: Any = None,
        principal: str | None = None,
    ):
        self._relay = relay
        self._principal = principal
        self._message = message
        self._method = method
        self._body = body
        self._headers = headers
        self._legacy = legacy
        self._sent = sent
        self._deadline: Deadline | None = None

    async def __aenter__(self) -> ByteReply:
        relay, method = self._relay, self._method
        if method == "POST":
            deadline = self._deadline = Deadline(relay._request_timeout_s)
            deadline.__enter__()
        message = self._message
        if not isinstance(message, dict):
            message = None
        span = self._span = tracing.upstream(message, "http", method)
        body, headers = self._body, self._headers
        if span is not tracing.NULL_UPSTREAM:
            if message is not None and body is not None:
                # Traced: a request's `_meta` carries this exchange's context as its headers do (an
                # upstream such as the mcp SDK reads only `_meta`), so the upstream's span is the
                # exchange's child. Only then is the body written again; the rest of it as it came.
                traced = span.message(message)
                if traced is not message:
                    body = jsonrpc.encode(traced)
            headers = span.headers(headers)
        response = None
        upstream = relay._upstream
        try:
            # The request awaited here, not in a coroutine of the upstream's: a level fewer for each suspension.
            try:
                response = self._response = await upstream.forwarding(method, body, headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise upstream.unsent(exc) from None
            if response.status in FOLLOWED:
                response = self._response = await upstream.follow(response, method, body, headers)
            if span is not tracing.NULL_UPSTREAM:  # the no-op span's calls are skipped, not made
                span.status(response.status)
            legacy = self._legacy
            initialize = legacy and message is not None and message.get("method") == "initialize"
            reply = relay._reply(response, self._sent, legacy, self._principal, initialize)
            if reply is None:  # the body is still arriving: read, then the same again
                whole = await upstream.read_body(response)
                reply = relay._reply(response, self._sent, legacy, self._principal, initialize, whole)
                assert reply is not None  # given the body
            return reply
        except BaseException as exc:
            if response is not None:
                response.close()
            self._end(type(exc), exc)
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._response.close()  # set: entering succeeded
        self._end(exc_type, exc)

    def _end(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """Leave the deadline; an upstream failure or the deadline becomes the client's error."""
        span = self._span
        if span is not tracing.NULL_UPSTREAM:
            span.end(exc)
        deadline = self._deadline
        if deadline is not None:
            try:
                deadline.__exit__(exc_type, exc, None)
            except TimeoutError:
                relay = self._relay
                raise relay._failures.timeout(relay._upstream.name) from None
        if exc is not None and isinstance(exc, UpstreamError):
            relay = self._relay
            raise relay._failures.client_error(exc) from None
