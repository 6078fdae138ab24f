"""SSE event ids on legacy POST streams, and what a client resuming one (GET + Last-Event-ID) gets.

2025-11-25 transports.mdx §Resumability: a server may put ids on the events of a POST's SSE
stream; a client whose stream broke before the response reconnects with GET and `Last-Event-ID`,
on any replica behind a balancer. The mcp SDK clients do so only for a stream that showed an id,
so a 2025-11-25 session's stream opens with a priming event (an id, empty data) and every
message carries one; older clients get ids on their messages only (they cannot read an empty
event). Without any id a client whose stream broke waits forever for its response.

An id is a sealed head naming the stream (purpose "evt", bound to the session id): the replica
that wrote it, the request's JSON-RPC id, then `.n`, the event's sequence number in clear. The
head is sealed once per stream, on its first event; a reply sent as plain JSON costs nothing.

An upstream exchange whose stream broke is not continued (the proxy cancels it upstream when its
client's connection goes, as 2026-07-28 upstreams do): the resuming client gets the JSON-RPC
error for its request at once instead of waiting for a response that will never come. A request
in the middle of an input round is carried on instead (relay/legacy_to_modern.py `resume`,
relay/input_rounds.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..protocol import jsonrpc
from ..protocol.sse import encode_event
from ..state.sealing import Sealer

_PURPOSE = "evt"
_MAX_SEQ_DIGITS = 12


class EventIds:
    """The ids of one stream's events, minted lazily."""

    __slots__ = ("_head", "_request_id", "_sealer", "_seq", "_session_id", "_writer", "prime")

    def __init__(self, sealer: Sealer, session_id: str, request_id: Any, writer: str, *, prime: bool) -> None:
        self._sealer = sealer
        self._session_id = session_id
        self._request_id = request_id
        self._writer = writer
        self._head: str | None = None
        self._seq = 0
        self.prime = prime  # the stream opens with an id and empty data (2025-11-25 and later)

    def next(self) -> str:
        if self._head is None:
            plaintext = orjson.dumps({"w": self._writer, "r": self._request_id})
            self._head = self._sealer.seal(_PURPOSE, plaintext, self._session_id.encode())
        self._seq += 1
        return f"{self._head}.{self._seq}"

    @property
    def seq(self) -> int:
        """The sequence number of the last event written."""
        return self._seq

    def priming_event(self) -> bytes:
        return b"id: " + self.next().encode() + b"\ndata: \n\n"


@dataclass(frozen=True, slots=True)
class ResumedStream:
    writer: str  # the boot id of the replica that wrote the stream
    request_id: Any
    seq: int


def open_event_id(sealer: Sealer, session_id: str, last_event_id: str) -> ResumedStream | None:
    """The stream a `Last-Event-ID` names, if this proxy wrote it for this session."""
    head, dot, seq = last_event_id.rpartition(".")
    if not dot or not seq.isdigit() or len(seq) > _MAX_SEQ_DIGITS:
        return None
    plaintext = sealer.open(_PURPOSE, head, session_id.encode())
    if plaintext is None:
        return None
    try:
        claims = orjson.loads(plaintext)
        writer, request_id = claims["w"], claims["r"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(writer, str):
        return None
    return ResumedStream(writer, request_id, int(seq))


def lost_stream_events(resumed: ResumedStream, here: str) -> bytes:
    """The one event a resuming client gets: its request's error (its outcome upstream unknown)."""
    where = "on this replica" if resumed.writer == here else "on another proxy replica, which has stopped or dropped it"
    error = jsonrpc.error_response(
        resumed.request_id,
        jsonrpc.INTERNAL_ERROR,
        f"interrupted: the stream of this request broke {where}; the request did not complete and its "
        "outcome upstream is unknown. Re-issue it if that is safe.",
        {"reason": "stream_lost", "resumedAfter": resumed.seq},
    )
    return encode_event(jsonrpc.encode(error))
