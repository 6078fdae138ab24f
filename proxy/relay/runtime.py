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
    """One open legacy GET stream: a queue the HTTP handler drains."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[JSONDict | None] = asyncio.Queue()

    def put(self, message: JSONDict) -> None:
        self.queue.put_nowait(message)

    def close(self) -> None:
        self.queue.put_nowait(_CLOSED)


class SessionRuntime(Generic[L]):
    """`live` is the backend's own part of the session (its process, its upstream listen)."""

    def __init__(self, session_id: str, live: L, backlog_size: int) -> None:
        self.session_id = session_id
        self.live = live
        self.initialized = asyncio.Event()
        self.server_request_ids = itertools.count(1)  # never reused within the session
        # Server-to-client requests awaited, by the id sent (a sealed string with several replicas).
        self.pending: dict[int | str, asyncio.Future[JSONDict]] = {}
        self.inflight: dict[Any, CancelScope] = {}  # the client's requests running, by its request id
        self.get_streams: list[GetStream] = []
        self.backlog: deque[JSONDict] = deque(maxlen=backlog_size)
        self.tasks = TaskScope("legacy session")  # ended with the session
        self.session: LegacySession | None = None  # the session's latest state as this replica loaded it
        self.last_used = 0.0  # when this replica last served the session (a shared store's idle release)

    def deliver(self, message: JSONDict) -> None:
        """Hand an unsolicited message to exactly one GET stream (legacy forbids fan-out)."""
        if self.get_streams:
            self.get_streams[-1].put(message)
        else:
            self.backlog.append(message)

    def open_stream(self, limit: int) -> GetStream:
        """A new GET stream, given the messages held for it meanwhile; 409 past `limit`."""
        if len(self.get_streams) >= limit:
            raise ProxyError(
                jsonrpc.LIMIT_EXCEEDED, "too many open GET streams for this session", status=409, outcome="rejected"
            )
        stream = GetStream()
        self.get_streams.append(stream)
        while self.backlog:
            stream.put(self.backlog.popleft())
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
