"""One upstream `subscriptions/listen` kept matching a filter (docs/translation.md §3.7): the
listen a caller's legacy sessions share (relay/session_listens.py), and the cache's own watch.

The filter is recomputed from its owner's state whenever it may have changed; a changed filter
opens a new listen, waits for its acknowledgement, then closes the old one, so nothing is lost
meanwhile (what arrives during the overlap may come twice). A lost stream is reopened with
backoff, and the owner is told to refetch what it may have missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from .. import tracing
from ..protocol import jsonrpc
from ..protocol.legacy_to_modern import gap_notifications
from ..protocol.methods import LIST_CHANGED
from ..upstream.errors import UpstreamError, UpstreamProtocolError

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

ACK_TIMEOUT_S = 10.0
_ACK = "notifications/subscriptions/acknowledged"
_LISTEN_METHODS = frozenset({method for _, method in LIST_CHANGED.values()} | {"notifications/resources/updated"})


@dataclass(eq=False)
class _Listen:
    filter: JSONDict
    acked: asyncio.Future[JSONDict]
    task: asyncio.Task[None] | None = None
    closing: bool = False


class UpstreamListener:
    def __init__(
        self,
        *,
        open_stream: Callable[[JSONDict], Any],  # filter -> async context manager of the messages
        current_filter: Callable[[], JSONDict],
        deliver: Callable[[JSONDict], object],
        retry_max_s: float,
        on_stream_change: Callable[[int], None] = lambda delta: None,
    ) -> None:
        self._open_stream = open_stream
        self._current_filter = current_filter
        self._deliver = deliver
        self._retry_max_s = retry_max_s
        self._on_stream_change = on_stream_change
        self._active: _Listen | None = None
        self._lock = asyncio.Lock()

    def running(self) -> tuple[JSONDict, asyncio.Future[JSONDict]] | None:
        """The filter of the listen running now and its acknowledgement (None: none runs)."""
        active = self._active
        if active is None or active.closing or active.task is None or active.task.done():
            return None
        return active.filter, active.acked

    async def refresh(self) -> JSONDict:
        """Make the upstream listen match the owner's current filter; returns the ack."""
        async with self._lock:
            wanted = self._current_filter()
            active = self._active
            if (
                active is not None
                and active.filter == wanted
                and not active.closing
                and active.task is not None
                and not active.task.done()
            ):
                return await asyncio.shield(active.acked)
            if not wanted:
                self._active = None
                if active is not None:
                    await self._stop(active)
                return {}
            fresh = _Listen(wanted, asyncio.get_running_loop().create_future())
            fresh.task = asyncio.create_task(self._run(fresh), name="upstream-listen", context=tracing.background())
            try:
                async with asyncio.timeout(ACK_TIMEOUT_S):
                    ack = await asyncio.shield(fresh.acked)
            except BaseException:
                await self._stop(fresh)
                raise
            self._active = fresh
            if active is not None:
                await self._stop(active)
            return ack

    async def close(self) -> None:
        async with self._lock:
            active, self._active = self._active, None
            if active is not None:
                await self._stop(active)

    async def _stop(self, listen: _Listen) -> None:
        listen.closing = True
        if listen.task is not None and not listen.task.done():
            listen.task.cancel()
            await asyncio.gather(listen.task, return_exceptions=True)

    async def _run(self, listen: _Listen) -> None:
        backoff = 0.25
        reconnecting = False
        while not listen.closing:
            self._on_stream_change(1)
            try:
                async with self._open_stream(listen.filter) as messages:
                    async for message in messages:
                        if self._handle(listen, message, reconnecting):
                            backoff = 0.25
                        if "id" in message and "method" not in message:
                            break  # graceful completion: the upstream ended the subscription
                    if not listen.acked.done():
                        raise UpstreamProtocolError("listen", "closed the listen stream before acknowledging it")
            except asyncio.CancelledError:
                raise
            except UpstreamError as exc:
                if not listen.acked.done():
                    listen.acked.set_exception(exc)
                    return
                log.warning("listen_lost", error=str(exc))
            finally:
                self._on_stream_change(-1)
            if listen.closing:
                return
            reconnecting = True
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._retry_max_s)

    def _handle(self, listen: _Listen, message: JSONDict, reconnecting: bool) -> bool:
        """Process one listen message; True when it was the acknowledgement."""
        method = message.get("method")
        if "id" in message and method is None:
            return False
        if method == _ACK:
            params = jsonrpc.params_of(message)
            ack = jsonrpc.obj(params.get("notifications"))
            if not listen.acked.done():
                listen.acked.set_result(ack)
            elif reconnecting:
                # A stream that came back cannot replay what was lost meanwhile.
                for note in gap_notifications(ack):
                    self._deliver(note)
            return True
        if method not in _LISTEN_METHODS or not listen.acked.done():
            return False  # never relay what was not asked for, or anything before the ack
        self._deliver(message)
        return False


def listen_request(upstream_id: Any, filter_: JSONDict, request_meta: JSONDict) -> JSONDict:
    return jsonrpc.request(upstream_id, "subscriptions/listen", {"_meta": request_meta, "notifications": filter_})
