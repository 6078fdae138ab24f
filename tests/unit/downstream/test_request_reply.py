"""A reply lives exactly as long as its handler (proxy/downstream/reply.py)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.downstream.reply import ReplyClosed, RequestReply


def request(accept: str = "application/json, text/event-stream"):
    return make_mocked_request("POST", "/mcp", headers={"Accept": accept})


async def test_leaving_the_reply_scope_disarms_its_keepalive_and_refuses_writes() -> None:
    async with RequestReply(request(), keepalive_s=0.01) as reply:
        timer = reply._slow
        assert timer is not None and not timer.cancelled()
    assert reply.closed and timer.cancelled()
    with pytest.raises(ReplyClosed):
        await reply.send({"jsonrpc": "2.0", "method": "notifications/progress"})


async def test_a_failure_inside_the_reply_scope_disarms_it_too() -> None:
    with pytest.raises(ValueError, match="a bug"):
        async with RequestReply(request(), keepalive_s=0.01) as reply:
            raise ValueError("a bug")
    assert reply.closed and reply._slow is not None and reply._slow.cancelled()
    assert reply._opening is None and not reply.started


async def test_a_client_that_accepts_only_json_gets_no_keepalive_timer() -> None:
    async with RequestReply(request("application/json"), keepalive_s=0.01) as reply:
        assert reply._slow is None and not reply.can_stream
