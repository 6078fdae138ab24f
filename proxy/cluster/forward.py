"""The forwarding side of a replay: the replica an echoed token lands on, when the token names
another replica, replays the client's request at that owner and copies its reply back as it comes
(the package's docstring says why)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import aiohttp
import structlog
from aiohttp import web

from .. import tracing
from ..config import Settings
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..protocol.request_state import RequestStateCodec
from ..protocol.sse import encode_event
from ..state.sealing import Sealer
from .envelope import (
    HOP_BY_HOP,
    REFUSED_HEADER,
    REPLAY_PATH,
    REPLAYED_HEADER,
    TARGET_HEADER,
    Envelope,
    replayed_headers,
    seal_envelope,
)
from .owners import Owner, OwnerGone, ServerRequestIds, call_lost

log = structlog.get_logger(__name__)


class Forwarder:
    """Decides whether an echoed token names another replica, and replays requests there.

    Nothing is forwarded unless this replica has an address itself (`replicas.advertised`): a
    single replica never forwards, and its tokens name nowhere.
    """

    def __init__(
        self,
        settings: Settings,
        sealer: Sealer,
        owner: Owner,
        codec: RequestStateCodec,
        server_ids: ServerRequestIds,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._sealer = sealer
        self.owner = owner
        self._codec = codec
        self.server_ids = server_ids
        self._metrics = metrics
        self._clock = clock
        self._identity = settings.security.identity_header
        self._client: aiohttp.ClientSession | None = None
        config = settings.replicas
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=config.forward_connect_timeout_s,
            sock_connect=config.forward_connect_timeout_s,
            # The owner answers within its own deadline, and keeps a long reply alive meanwhile.
            sock_read=settings.upstream.request_timeout_s + settings.streams.keepalive_s,
        )

    @property
    def enabled(self) -> bool:
        return self.owner.address is not None

    async def start(self) -> None:
        if self.enabled and self._client is None:
            # One client for every forward; the bytes are relayed as they come (no decompression).
            self._client = aiohttp.ClientSession(auto_decompress=False, timeout=self._timeout)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # ------------------------------------------------------------ the decision

    def state_owner(self, token: object, principal: str) -> Owner | None:
        """The other replica holding the parked call a requestState names; None: serve it here
        (ours, not a valid token, or naming a replica nobody can reach)."""
        if not self.enabled:
            return None
        claims = self._codec.verify(token, principal)
        if claims is None or self._codec.is_local(claims) or claims.address is None:
            return None
        return Owner(claims.boot, claims.address)

    def request_owner(self, request_id: object, session_id: str) -> Owner | None:
        """The other replica that sent the server-to-client request a legacy client answers."""
        if not self.enabled:
            return None
        owner = self.server_ids.owner_of(request_id, session_id)
        if owner is None or owner.boot == self.owner.boot or owner.address is None:
            return None
        return owner

    def stream_owner(self, holder: str) -> Owner | None:
        """The other replica holding a legacy session's GET stream, from the session's record
        (`boot@address`, written by that replica); None: this one, or nobody reachable."""
        boot, at, address = holder.partition("@")
        if not self.enabled or not at or not address or boot == self.owner.boot:
            return None
        return Owner(boot, address)

    # ------------------------------------------------------------ replays

    async def replay(
        self,
        request: web.Request,
        body: bytes,
        owner: Owner,
        *,
        kind: str,
        request_id: jsonrpc.RequestId | None = None,
        route: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        """Serve `request` (with `body`) at `owner`, its reply copied to the client as it comes;
        raises OwnerGone, before anything is sent, when the owner cannot serve it. Should the owner
        die once its SSE reply began, the stream ends with `request_id`'s error (the call is lost).
        `route`: the owner's handler other than the endpoint's for the request's method;
        `extra_headers`: headers (mcp-*) the replay carries beside the client's."""
        async with self._send(request, body, owner, kind, route, extra_headers) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            tail = b"\n\n"  # the last bytes copied: whether they end an event
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    tail = (tail + chunk)[-4:]
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._count(kind, "owner_gone")
                log.warning("forward_broken", kind=kind, owner=owner.boot, error=str(exc) or type(exc).__name__)
                if sse and request_id is not None and tail.endswith((b"\n\n", b"\r\n\r\n", b"\r\r")):
                    # After the last whole event, the request's own end: the call is lost.
                    lost = call_lost()
                    error = jsonrpc.error_response(request_id, lost["code"], lost["message"], lost["data"])
                    await response.write(encode_event(jsonrpc.encode(error), event="message"))
                    await response.write_eof()
                elif request.transport is not None:
                    # Midway through a message: the reply is broken off, never ended as if whole.
                    request.transport.close()
                return response
            await response.write_eof()
            self._count(kind, "ok")
            return response

    async def deliver(
        self, request: web.Request, message: jsonrpc.JSONDict, owner: Owner, *, kind: str = "deliver"
    ) -> bool:
        """Hand a legacy client's answer to the replica awaiting it; False if it is gone."""
        try:
            async with self._send(request, jsonrpc.encode(message), owner, kind) as upstream:
                await upstream.read()
        except OwnerGone as exc:
            log.info("answer_undeliverable", owner=owner.boot, reason=exc.outcome, detail=str(exc))
            return False
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._count(kind, "owner_gone")
            log.info("answer_undeliverable", owner=owner.boot, reason="owner_gone", detail=str(exc))
            return False
        self._count(kind, "ok")
        return True

    def _send(
        self,
        request: web.Request,
        body: bytes,
        owner: Owner,
        kind: str,
        route: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> _Sent:
        assert owner.address is not None
        # A hop of the request's trace: the owner's span is the child of this one.
        span = tracing.upstream(None, "http", "POST", name=f"replay {kind}")
        headers = replayed_headers(span.headers(request.headers), self._identity)
        headers += [(name, value) for name, value in (extra_headers or {}).items()]
        envelope = Envelope(route or request.method, headers, body)
        token = seal_envelope(self._sealer, owner.boot, envelope, self._clock())
        return _Sent(self, owner, token, kind, span)

    def _count(self, kind: str, outcome: str) -> None:
        self._metrics.forwards.labels(kind, outcome).inc()


class _Sent:
    """One replay in flight: entered, the owner's reply (its status and headers in); OwnerGone
    (counted) when there is none to relay."""

    def __init__(self, forwarder: Forwarder, owner: Owner, token: str, kind: str, span: tracing.UpstreamSpan) -> None:
        self._forwarder = forwarder
        self._owner = owner
        self._token = token
        self._kind = kind
        self._span = span
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            return await self._open()
        except BaseException as exc:
            self._span.end(exc)  # __aexit__ does not run
            raise

    async def _open(self) -> aiohttp.ClientResponse:
        forwarder, owner = self._forwarder, self._owner
        client = forwarder._client
        if client is None:
            raise self._gone("refused", "the forwarder is not running")
        url = f"http://{owner.address}{REPLAY_PATH}"
        headers = {TARGET_HEADER: owner.boot, "Content-Type": "application/octet-stream"}
        try:
            response = await client.post(url, data=self._token.encode("ascii"), headers=headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._gone("owner_gone", f"{type(exc).__name__}: {exc}") from None
        self._span.status(response.status)
        refused = response.headers.get(REFUSED_HEADER)
        if refused is not None or response.headers.get(REPLAYED_HEADER) != owner.boot:
            response.release()
            if response.status == 410:
                raise self._gone("owner_gone", "a new process serves its address")
            raise self._gone("refused", f"its internal listener answered {response.status} ({refused})")
        self._response = response
        return response

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            if self._response is not None:
                if exc_type is None:
                    self._response.release()
                else:  # the client went (or the copy failed): the owner sees its client go too
                    self._response.close()
        finally:
            self._span.end(exc)

    def _gone(self, outcome: str, detail: str) -> OwnerGone:
        self._forwarder._count(self._kind, outcome)
        level = log.warning if outcome == "refused" else log.info
        level("forward_failed", kind=self._kind, owner=self._owner.boot, outcome=outcome, detail=detail)
        return OwnerGone(outcome, detail)
