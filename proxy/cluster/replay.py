"""The owning side of a replay: the internal listener that serves what another replica forwards."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict, CIMultiDictProxy

from ..protocol import jsonrpc
from ..seams.aiohttp_internals import set_body
from ..state.sealing import Sealer
from .envelope import REFUSED_HEADER, REPLAY_PATH, REPLAYED_HEADER, TARGET_HEADER, open_envelope
from .owners import Owner

log = structlog.get_logger(__name__)
_SERVED_MAX = 65_536  # envelopes remembered as served (about 2,000 replays a second for 30 s)


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
        set_body(replayed, envelope.body)
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
