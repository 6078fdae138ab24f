"""What a request's own reply channel answers (proxy/relay/channel.py)."""

from __future__ import annotations

from proxy.relay.channel import NO_STREAM, RequestChannel


async def test_a_request_channel_bounds_an_exchange_by_the_request_timeout() -> None:
    assert RequestChannel().exchange_bound_s(30.0) == 30.0
    assert NO_STREAM.exchange_bound_s(2.5) == 2.5


async def test_a_request_channel_rounds_are_resumable_and_an_answered_round_changes_nothing() -> None:
    channel = RequestChannel()
    assert channel.resumable and NO_STREAM.resumable
    assert await channel.answered() is None
    assert not NO_STREAM.can_stream
