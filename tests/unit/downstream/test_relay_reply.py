"""A reply relayed byte for byte (proxy/downstream/reply.py relay_reply) whose client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import pytest
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.test_utils import make_mocked_request

from proxy.downstream.reply import DELIVERED, relay_reply
from proxy.relay.bytes import ByteReply

EVENTS = [b"event: message\ndata: {}\n\n", b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n']


class Forward:
    """A relay's reply of two SSE events; `left` says whether the relay was left (its upstream reply closed)."""

    def __init__(self) -> None:
        self.left = False
        self.sent: list[bytes] = []

    async def _chunks(self) -> AsyncIterator[bytes]:
        for chunk in EVENTS:
            self.sent.append(chunk)
            yield chunk

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[ByteReply]:
        try:
            yield ByteReply(200, {"Content-Type": "text/event-stream"}, None, self._chunks())
        finally:
            self.left = True


def gone() -> ClientConnectionResetError:
    return ClientConnectionResetError("Cannot write to closing transport")


def request(**writer: Any) -> Any:
    made = make_mocked_request("POST", "/mcp")
    for name, effect in writer.items():
        setattr(made._payload_writer, name, mock.AsyncMock(side_effect=effect))
    return made


async def test_a_stream_written_whole_is_ok() -> None:
    forward = Forward()
    stream, outcome = await relay_reply(request(), forward())
    assert (stream.status, outcome, forward.sent, forward.left) == (200, "ok", EVENTS, True)


async def test_a_client_that_closes_after_its_last_event_had_its_reply() -> None:
    forward = Forward()
    stream, outcome = await relay_reply(request(write_eof=gone()), forward())
    assert (stream.status, outcome, forward.sent, forward.left) == (200, "ok", EVENTS, True)


async def test_a_client_gone_while_its_stream_is_written_cancelled_it_and_the_upstream_reply_is_left() -> None:
    forward = Forward()
    stream, outcome = await relay_reply(request(write=[None, gone()]), forward())
    assert (stream.status, outcome, forward.left) == (200, "cancelled", True)


class Answering:
    """What a relayed POST's stream still owes: the answer to request 1, until its event passes."""

    def __init__(self) -> None:
        self.unanswered = {1}


class StillEnding(Forward):
    """A stream whose upstream has sent the answer but not yet ended: the relay waits there."""

    def __init__(self) -> None:
        super().__init__()
        self.check = Answering()
        self.waiting = asyncio.Event()

    async def _chunks(self) -> AsyncIterator[bytes]:
        for chunk in EVENTS:
            if b'"id":1' in chunk:
                self.check.unanswered.discard(1)  # as EventCheck does once the answer is complete
            self.sent.append(chunk)
            yield chunk
        self.waiting.set()
        await asyncio.Event().wait()  # the upstream's end, not yet come
        yield b""

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[ByteReply]:
        try:
            yield ByteReply(200, {"Content-Type": "text/event-stream"}, None, self._chunks(), self.check)  # type: ignore[arg-type]
        finally:
            self.left = True


@pytest.mark.parametrize(
    ("awaited", "delivered"),
    [
        pytest.param({1}, True, id="answered"),
        pytest.param({1, 2}, None, id="a batch whose request 2 is never answered"),
    ],
)
async def test_a_client_that_leaves_while_the_upstream_stream_ends_had_its_reply_once_every_answer_was_written(
    awaited: set[int], delivered: bool | None
) -> None:
    """Its handler is cancelled (the client closed the connection); the request says whether it
    was answered."""
    forward, made = StillEnding(), request()
    forward.check.unanswered = set(awaited)
    relaying = asyncio.create_task(relay_reply(made, forward()))
    async with asyncio.timeout(5):
        await forward.waiting.wait()
    relaying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relaying
    assert made.get(DELIVERED) is delivered and forward.left and forward.sent == EVENTS
