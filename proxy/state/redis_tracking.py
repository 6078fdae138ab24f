"""Which records other replicas changed: Redis says so on a dedicated connection (server-assisted
client-side caching), so a replica may serve a session from its local copy without a round trip.

The connection turns `CLIENT TRACKING on REDIRECT <itself> BCAST PREFIX <namespace>:{` on and
subscribes to `__redis__:invalidate` (RESP2: redis-py 8's asyncio client has no client-side
caching, and its pub/sub reader runs as a task). From then on Redis names every key under the
prefix that any connection modifies (a write, a TTL changed, an expiry, a FLUSHDB: all keys), from
any replica, of any version of the proxy. The messages are applied in `data_received`, in the loop
callback that reads them off the socket: no request that the event loop sees after those bytes can
be served the copy they invalidate.

The copies may only be trusted while the connection is known to deliver: `healthy` is false from
the start until the subscription is confirmed, when the connection is lost, and when no answer to
the heartbeat (a PING every `_INTERVAL_S`) came for `_INTERVAL_S` plus the store's deadline (a
connection that silently stopped delivering). `epoch` changes with every gain and loss; on each,
`on_reset` drops every copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

log = structlog.get_logger(__name__)

_CHANNEL = b"__redis__:invalidate"
_INTERVAL_S = 1.0  # heartbeat
_BACKOFF_S = 0.5  # between attempts to connect


class RespError(Exception):
    """An error reply (-ERR ...)."""


_INCOMPLETE = object()


def _parse_one(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 value from `buf` at `pos` and where the next one starts, or (_INCOMPLETE, pos)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind, line, after = buf[pos], bytes(buf[pos + 1 : end]), end + 2
    if kind == 43:  # +
        return line, after
    if kind == 45:  # -
        return RespError(line.decode(errors="replace")), after
    if kind == 58:  # :
        return int(line), after
    if kind == 36:  # $
        size = int(line)
        if size < 0:
            return None, after
        if len(buf) < after + size + 2:
            return _INCOMPLETE, pos
        return bytes(buf[after : after + size]), after + size + 2
    if kind == 42:  # *
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            item, after = _parse_one(buf, after)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, after
    raise ValueError(f"not RESP2: {bytes(buf[pos : pos + 16])!r}")


def parse(buf: bytearray) -> list[Any]:
    """The complete values at the head of `buf`, taken out of it."""
    values, pos = [], 0
    while pos < len(buf):
        value, pos_after = _parse_one(buf, pos)
        if value is _INCOMPLETE:
            break
        values.append(value)
        pos = pos_after
    del buf[:pos]
    return values


def command(*args: bytes | str | int) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class _Wire(asyncio.Protocol):
    def __init__(self, owner: Tracking) -> None:
        self._owner = owner
        self._buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.live = False  # handshake done: messages are applied as they arrive
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's TCP transports are not asyncio.Transport
        # subclasses, though they have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            values = parse(self._buf)
        except ValueError:
            self.abort()
            return
        for value in values:
            if self.live:
                self._owner._message(value)
            else:
                self.replies.put_nowait(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self.live = False
        if not self.closed.done():
            self.closed.set_result(None)
        self._owner._lost(self)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    async def reply(self) -> Any:
        value = await self.replies.get()
        if isinstance(value, RespError):
            raise value
        return value


class Tracking:
    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        on_keys: Callable[[Sequence[bytes] | None], None],
        on_reset: Callable[[], None],
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._prefix = prefix
        self._on_keys = on_keys
        self._on_reset = on_reset
        self._timeout_s = max(timeout_s, 0.05)
        self._grace_s = _INTERVAL_S + max(self._timeout_s, 0.25)
        self._clock = clock
        self._wire: _Wire | None = None
        self._heard = 0.0
        # Until when the copies may be trusted: the last message heard plus the grace while a live
        # connection delivers, else never (-inf). Kept as changes are heard, so `healthy`, asked on
        # every request, compares one number.
        self._trusted_until = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.epoch = 0
        self.closed = False

    # ------------------------------------------------------------ what the store asks

    def healthy(self) -> bool:
        """Whether every change made in Redis until a moment ago has been applied here."""
        if self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-tracking")
        return self._clock() <= self._trusted_until

    def cut(self) -> None:
        """Drop the connection (it is made again): what a network failure does."""
        if self._wire is not None:
            self._wire.abort()

    async def aclose(self) -> None:
        self.closed = True
        self.cut()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------ the connection

    async def _run(self) -> None:
        while not self.closed:
            try:
                wire = await self._connect()
            except (OSError, TimeoutError, RespError, ValueError) as exc:
                log.warning("store_tracking_down", reason="connect", error=str(exc) or type(exc).__name__)
                await asyncio.sleep(_BACKOFF_S)
                continue
            log.info("store_tracking_up")
            while not wire.closed.done():
                wire.send(command("PING"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(wire.closed), _INTERVAL_S)
                if not wire.closed.done() and self._clock() - self._heard > self._grace_s:
                    log.warning("store_tracking_down", reason="silent", silent_s=round(self._clock() - self._heard, 3))
                    wire.abort()
            await asyncio.sleep(_BACKOFF_S)

    async def _connect(self) -> _Wire:
        parts = urlsplit(self._url)
        context: ssl.SSLContext | None = None
        if parts.scheme == "rediss":
            query = parse_qs(parts.query)
            cafile = query.get("ssl_ca_certs")
            context = ssl.create_default_context(cafile=cafile[0] if cafile else None)
            if (query.get("ssl_cert_reqs") or [""])[0].lower() in ("none", "optional"):
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._timeout_s * 4):
            _, wire = await loop.create_connection(
                lambda: _Wire(self), parts.hostname or "localhost", parts.port or 6379, ssl=context
            )
        try:
            async with asyncio.timeout(self._timeout_s * 4):
                if parts.password is not None:
                    user = unquote(parts.username) if parts.username else "default"
                    wire.send(command("AUTH", user, unquote(parts.password)))
                    await wire.reply()
                wire.send(command("CLIENT", "ID"))
                client_id = await wire.reply()
                wire.send(command("CLIENT", "TRACKING", "on", "REDIRECT", client_id, "BCAST", "PREFIX", self._prefix))
                await wire.reply()
                wire.send(command("SUBSCRIBE", _CHANNEL))
                confirmed = await wire.reply()
                if not (isinstance(confirmed, list) and confirmed[:2] == [b"subscribe", _CHANNEL]):
                    raise ValueError(f"unexpected answer to SUBSCRIBE: {confirmed!r}")
        except BaseException:
            wire.abort()
            raise
        # Live: copies held before this moment may have missed changes.
        self._wire = wire
        self._heard = self._clock()
        self.epoch += 1
        self._on_reset()
        wire.live = True
        self._trusted_until = self._heard + self._grace_s
        while not wire.replies.empty():  # what came right behind the confirmation
            self._message(wire.replies.get_nowait())
        return wire

    def _message(self, value: Any) -> None:
        # Only a live connection's messages get here (the one connection, see _connect).
        heard = self._heard = self._clock()
        self._trusted_until = heard + self._grace_s
        if isinstance(value, list) and len(value) == 3 and value[0] == b"message" and value[1] == _CHANNEL:
            keys = value[2]
            self._on_keys(keys if isinstance(keys, list) else None)  # None: everything (FLUSHDB)

    def _lost(self, wire: _Wire) -> None:
        if wire is not self._wire:
            return  # a handshake that failed: nothing was trusted yet
        self._wire = None
        self._trusted_until = float("-inf")
        self.epoch += 1
        self._on_reset()
        if not self.closed:
            log.warning("store_tracking_down", reason="lost")
