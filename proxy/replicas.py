"""Routing to the owner of live objects, when several replicas serve one endpoint.

What cannot move between replicas (a parked legacy call, a server-to-client request awaiting a
legacy client's answer) stays on the process that made it. The tokens a client echoes back name
that process, sealed: its boot id (random, per process) and the address other replicas reach its
internal listener at. The replica an echo lands on forwards ("replays") the client's request
there, over the one internal endpoint `POST /_mep/v1/replay`, and copies the reply back as it
comes. The target serves a replay exactly as if the client had sent it to its public endpoint.

A replay's body is an envelope sealed for the target's boot id, expiring in seconds: the internal
listener refuses whatever it did not mint (401), and a replay meant for an earlier process at the
same address (410: the call it names is gone). Addresses come only from tokens this proxy sealed,
so the forwarder can never be made to reach anywhere else.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import aiohttp
import orjson
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from . import tracing
from .config import Settings
from .metrics import Metrics
from .protocol import jsonrpc, meta
from .protocol.request_state import RequestStateCodec
from .protocol.sse import encode_event
from .sealing import Sealer
from .sessions import short_hash

log = structlog.get_logger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REPLAY_PATH = "/_mep/v1/replay"
TARGET_HEADER = "Mep-Target-Boot"  # whom a replay is for: the envelope's associated data
REPLAYED_HEADER = "Mep-Replayed-By"  # on every reply of the internal listener: the boot that served it
REFUSED_HEADER = "Mep-Replay-Refused"  # on the internal listener's own refusals: why
ENVELOPE_TTL_S = 30.0
_SERVED_MAX = 65_536  # envelopes remembered as served (about 2,000 replays a second for 30 s)
_SERVER_REQUEST = "srq"
_FORWARD = "fwd"
# What a replay carries of the client's request, beside the MCP headers (Mcp-*, which include the
# session id and the protocol version), the trace context and the identity header.
_REPLAYED = frozenset({"accept", "content-type", "authorization", "last-event-id"})
# What the forwarding replica does not copy from the owner's reply: its own framing.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server", "upgrade"}
    | {REPLAYED_HEADER.lower()}
)


V = TypeVar("V", int, str)  # the value an owner token carries beside its owner


def new_boot_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Owner:
    """One replica process: its boot id, and where other replicas reach it (None: nowhere)."""

    boot: str
    address: str | None


class OwnerGone(Exception):
    """The replica holding a live object cannot be reached, or is a new process now."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome  # "owner_gone" | "refused" (its listener would not open our envelope)


def call_lost() -> jsonrpc.JSONDict:
    """The error a client gets for a call whose owner is gone: it must issue the call again."""
    return {
        "code": jsonrpc.INTERNAL_ERROR,
        "message": "the proxy replica holding the parked call is gone; the call must be re-issued",
        "data": {"reason": "upstream_call_lost", "reissue": True},
    }


# ---------------------------------------------------------------- tokens naming their owner


class OwnerTokens(Generic[V]):
    """Tokens naming the replica that minted them: `[boot, address, value]`, sealed for one
    purpose, bound to a context by the associated data each mint and open is given. Any replica
    opens them (the secret is shared) and learns whom to forward to."""

    def __init__(self, sealer: Sealer, owner: Owner, purpose: str, value_type: type[V]) -> None:
        self._sealer = sealer
        self._owner = owner
        self._purpose = purpose
        self._value_type: type[V] = value_type

    def mint(self, value: V, aad: bytes) -> str:
        plaintext = orjson.dumps([self._owner.boot, self._owner.address, value])
        return self._sealer.seal(self._purpose, plaintext, aad)

    def open(self, token: object, aad: bytes) -> tuple[Owner, V] | None:
        """The replica a token names and its value; None if the proxy did not seal it for `aad`."""
        if not isinstance(token, str):
            return None
        plaintext = self._sealer.open(self._purpose, token, aad)
        if plaintext is None:
            return None
        try:
            boot, address, value = orjson.loads(plaintext)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return None
        if not isinstance(boot, str) or not isinstance(address, (str, type(None))):
            return None
        if not isinstance(value, self._value_type):
            return None
        return Owner(boot, address), value


# ---------------------------------------------------------------- server-to-client request ids


class ServerRequestIds:
    """The ids of the requests the proxy sends a legacy client on its session: sealed strings
    naming this replica and counting within the session, bound to the session (a hash of its id
    as associated data). Legacy clients echo them verbatim in their answers."""

    def __init__(self, sealer: Sealer, owner: Owner) -> None:
        self._tokens = OwnerTokens(sealer, owner, _SERVER_REQUEST, int)

    def mint(self, session_id: str, count: int) -> str:
        return self._tokens.mint(count, _session_aad(session_id))

    def owner_of(self, request_id: object, session_id: str) -> Owner | None:
        """The replica that sent the request `request_id` names in this session; None if the id
        is not one the proxy sealed for it."""
        opened = self._tokens.open(request_id, _session_aad(session_id))
        return opened[0] if opened is not None else None


def _session_aad(session_id: str) -> bytes:
    return short_hash(session_id).encode()


# ---------------------------------------------------------------- envelopes


# What a replay is served by at its owner: the endpoint's handler for its HTTP method, or a route of
# its own (an HTTP+SSE client's message, for the replica holding its stream).
SSE_MESSAGE_ROUTE = "SSE-MESSAGE"
_ROUTES = frozenset({"POST", "GET", "DELETE", SSE_MESSAGE_ROUTE})


@dataclass(frozen=True, slots=True)
class Envelope:
    method: str
    headers: list[tuple[str, str]]
    body: bytes
    expires: float = 0.0  # set when opened (sealing sets it from the clock)


def seal_envelope(sealer: Sealer, target: str, envelope: Envelope, now: float) -> str:
    head = orjson.dumps({"exp": round(now + ENVELOPE_TTL_S, 3), "m": envelope.method, "h": envelope.headers})
    return sealer.seal(_FORWARD, struct.pack(">I", len(head)) + head + envelope.body, target.encode())


def open_envelope(sealer: Sealer, target: str, token: object, now: float) -> Envelope | None:
    """The replay an envelope sealed for `target` holds, unexpired; None for anything else."""
    plaintext = sealer.open(_FORWARD, token, target.encode())
    if plaintext is None or len(plaintext) < 4:
        return None
    (size,) = struct.unpack(">I", plaintext[:4])
    try:
        head = orjson.loads(plaintext[4 : 4 + size])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict):
        return None
    expires, method, headers = head.get("exp"), head.get("m"), head.get("h")
    if not isinstance(expires, (int, float)) or expires <= now or method not in _ROUTES:
        return None
    if not isinstance(headers, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair) for pair in headers
    ):
        return None
    return Envelope(method, [(name, value) for name, value in headers], plaintext[4 + size :], float(expires))


def replayed_headers(headers: Mapping[str, str], identity_header: str | None) -> list[tuple[str, str]]:
    """What of the client's request headers a replay carries (everything its serving reads)."""
    wanted = _REPLAYED | set(meta.TRACE_KEYS) | ({identity_header.lower()} if identity_header else set())
    return [(k, v) for k, v in headers.items() if k.lower() in wanted or k.lower().startswith("mcp-")]


# ---------------------------------------------------------------- the forwarding side


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
                if name.lower() not in _HOP_BY_HOP:
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


# ---------------------------------------------------------------- the owning side


class ReplayEndpoint:
    """`POST /_mep/v1/replay` of the internal listener: a replay this proxy sealed for this very
    process, served by the public endpoint's own handlers (`handlers`, by HTTP method)."""

    def __init__(
        self, sealer: Sealer, owner: Owner, handlers: Mapping[str, Handler], clock: Callable[[], float] = time.time
    ) -> None:
        self._sealer = sealer
        self._owner = owner
        self._handlers = dict(handlers)
        self._clock = clock
        # Envelopes served, until they expire: each is served once (a forwarder never sends one
        # twice; a copy of one sent again is someone replaying it). Insertion order is expiry order.
        self._served: dict[bytes, float] = {}

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[REPLAYED_HEADER] = self._owner.boot

    async def handle(self, request: web.Request) -> web.StreamResponse:
        target = request.headers.get(TARGET_HEADER, "")
        raw = await _read_body(request)
        if raw is None:
            return _refusal(413, "too_large", "the replay is larger than any this proxy seals")
        token = raw.decode("ascii", errors="replace")
        envelope = open_envelope(self._sealer, target, token, self._clock())
        if envelope is None:
            log.warning("replay_refused", reason="unopenable")
            return _refusal(401, "unopenable", "the replay is not one this proxy sealed, or it expired")
        if target != self._owner.boot:
            return _refusal(410, "other_boot", "the replay is for a process that no longer serves here")
        if not self._first_use(hashlib.sha256(raw).digest()[:16], envelope.expires):
            log.warning("replay_refused", reason="replayed")
            return _refusal(401, "replayed", "the replay was served already")
        handler = self._handlers.get(envelope.method)
        if handler is None:
            return _refusal(401, "unopenable", "the replay's method is not served")
        # Served as if the client had sent it here: its method, headers and body.
        replayed = request.clone(method=envelope.method, headers=CIMultiDictProxy(CIMultiDict(envelope.headers)))
        replayed._read_bytes = envelope.body
        return await handler(replayed)

    def _first_use(self, digest: bytes, expires: float) -> bool:
        now = self._clock()
        served = self._served
        while served:  # forget what expired (the oldest first), and the oldest past the bound
            oldest = next(iter(served))
            if served[oldest] > now and len(served) < _SERVED_MAX:
                break
            del served[oldest]
        if served.get(digest, 0.0) > now:
            return False
        served[digest] = expires
        return True


async def _read_body(request: web.Request) -> bytes | None:
    """The body, read from the stream itself: aiohttp clones only a request whose body it did not
    read (the replay is served as a clone carrying the envelope's body instead)."""
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > request.client_max_size:
            return None
    return bytes(body)


def _refusal(status: int, reason: str, message: str) -> web.Response:
    body = jsonrpc.encode(jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, message))
    return web.Response(status=status, body=body, content_type="application/json", headers={REFUSED_HEADER: reason})


def internal_app(replay: ReplayEndpoint, wrap: Callable[[Handler], Handler], max_body_bytes: int) -> web.Application:
    """The internal listener's application: the replay endpoint, and JSON 404s for anything else."""
    # A replay holds a client's body (at most max_body_bytes), its headers and the sealing.
    app = web.Application(client_max_size=max_body_bytes * 4 // 3 + 65_536)
    app.on_response_prepare.append(replay.on_prepare)
    app.router.add_post(REPLAY_PATH, wrap(replay.handle))

    async def not_found(request: web.Request) -> web.StreamResponse:
        return _refusal(404, "not_found", "Not Found")

    app.router.add_route("*", "/{tail:.*}", wrap(not_found))
    return app
