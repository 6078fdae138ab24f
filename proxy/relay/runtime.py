"""Live, per-replica state of one legacy session: streams, waiters, requests in flight.

Created on first need and dropped with the session; never persisted (it holds futures and
tasks). What must survive a request lives in sessions.LegacySession instead.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any, Generic, TypeVar

from ..errors import ProxyError
from ..protocol import jsonrpc
from ..state.sessions import LegacySession
from .scopes import CancelScope, TaskScope

JSONDict = dict[str, Any]
L = TypeVar("L")
_CLOSED = None  # queue sentinel: the stream must end


class GetStream:
    """One open legacy GET stream: the messages its HTTP handler drains, in order, and the one
    waiter for them. Not an asyncio.Queue: that is four deques (with its Event's), some 2.5 KB,
    and a stream is held per session, mostly idle, by the thousand."""

    __slots__ = ("_head", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[JSONDict | None] = []
        self._head = 0  # the next to hand out: the list is emptied once drained, not shifted
        self._waiter: asyncio.Future[None] | None = None

    def put(self, message: JSONDict) -> None:
        self._items.append(message)
        self._wake()

    def close(self) -> None:
        self._items.append(_CLOSED)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> JSONDict | None:
        """The next message (None: the stream must end), waiting for it if need be (one reader)."""
        while self._head >= len(self._items):
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items[self._head]
        self._head += 1
        if self._head == len(self._items):
            self._items.clear()
            self._head = 0
        return item


class SessionRuntime(Generic[L]):
    """`live` is the backend's own part of the session (its process, its upstream listen).

    Held per session, mostly idle, by the thousand: what most sessions never use is made on first
    need (the backlog of messages for a stream not open yet, what waits for `initialized`)."""

    __slots__ = (
        "_backlog",
        "_backlog_size",
        "_initialized",
        "get_streams",
        "inflight",
        "last_used",
        "live",
        "pending",
        "server_request_ids",
        "session",
        "session_id",
        "tasks",
    )

    def __init__(self, session_id: str, live: L, backlog_size: int) -> None:
        self.session_id = session_id
        self.live = live
        # notifications/initialized came: True; False, or what waits for it while it has not.
        self._initialized: bool | asyncio.Event = False
        self.server_request_ids = itertools.count(1)  # never reused within the session
        # Server-to-client requests awaited, by the id sent (a sealed string with several replicas).
        self.pending: dict[int | str, asyncio.Future[JSONDict]] = {}
        self.inflight: dict[Any, CancelScope] = {}  # the client's requests running, by its request id
        self.get_streams: list[GetStream] = []
        self._backlog: deque[JSONDict] | None = None  # messages for the next stream, while none is open
        self._backlog_size = backlog_size
        self.tasks = TaskScope("legacy session")  # ended with the session
        self.session: LegacySession | None = None  # the session's latest state as this replica loaded it
        self.last_used = 0.0  # when this replica last served the session (a shared store's idle release)

    @property
    def initialized(self) -> bool:
        """The client said notifications/initialized (here, or to another replica)."""
        return self._initialized is True

    def mark_initialized(self) -> None:
        waiting, self._initialized = self._initialized, True
        if isinstance(waiting, asyncio.Event):
            waiting.set()

    async def wait_initialized(self) -> None:
        if self._initialized is True:
            return
        if self._initialized is False:
            self._initialized = asyncio.Event()
        await self._initialized.wait()

    def deliver(self, message: JSONDict) -> None:
        """Hand an unsolicited message to exactly one GET stream (legacy forbids fan-out)."""
        if self.get_streams:
            self.get_streams[-1].put(message)
            return
        if self._backlog is None:
            self._backlog = deque(maxlen=self._backlog_size)
        self._backlog.append(message)

    def open_stream(self, limit: int) -> GetStream:
        """A new GET stream, given the messages held for it meanwhile; 409 past `limit`."""
        if len(self.get_streams) >= limit:
            raise ProxyError(
                jsonrpc.LIMIT_EXCEEDED, "too many open GET streams for this session", status=409, outcome="rejected"
            )
        stream = GetStream()
        self.get_streams.append(stream)
        if self._backlog is not None:
            backlog, self._backlog = self._backlog, None
            for message in backlog:
                stream.put(message)
        return stream

    def detach(self, stream: GetStream) -> None:
        if stream in self.get_streams:
            self.get_streams.remove(stream)

    @property
    def busy(self) -> bool:
        return bool(self.get_streams or self.inflight)

    def end_streams(self) -> None:
        """End the GET streams (shutdown); requests in flight go on."""
        for stream in self.get_streams:
            stream.close()
        self.get_streams.clear()

    def close(self) -> None:
        self.end_streams()
        for scope in list(self.inflight.values()):
            scope.cancel()
        for future in self.pending.values():
            if not future.done():
                future.cancel()
        self.pending.clear()
