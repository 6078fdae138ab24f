"""Event ids on legacy POST streams, and a client resuming a broken one (GET + Last-Event-ID).

A 2025-11-25 session's stream opens with a priming event (an id, no data) so the client can
resume even a stream that broke before its first message; an older session's messages carry ids.
A resuming client gets its request's error at once, never a stream that waits forever.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.app import METRICS
from tests.integration.conftest import MakeProxy
from tests.support.fake_modern import Call, FakeModern, Outcome, complete, hang, notification
from tests.support.mcp_client import SseReader

WAIT = 10.0


async def _progress_then_hang(call: Call) -> Outcome:
    await call.send(notification("notifications/progress", {"progressToken": "p", "progress": 1}))
    return await hang(call)


async def _progress_then_answer(call: Call) -> Outcome:
    await call.send(notification("notifications/progress", {"progressToken": "p", "progress": 1}))
    return complete(content=[{"type": "text", "text": "done"}])


async def _open_stream(peer: Any) -> tuple[Any, SseReader]:
    params = {"name": "slow", "arguments": {}, "_meta": {"progressToken": "t"}}
    _, response = await peer.send("tools/call", params, id=41)
    assert response.status == 200 and response.content_type == "text/event-stream"
    return response, SseReader(response)


@pytest.mark.parametrize(("version", "primed"), [("2025-11-25", True), ("2025-06-18", False)])
async def test_stream_messages_carry_ids_and_new_sessions_get_a_priming_event(
    make_proxy: MakeProxy, fake: FakeModern, version: str, primed: bool
) -> None:
    fake.handlers["tools/call"] = _progress_then_answer
    peer = await (await make_proxy()).connect(version)
    async with asyncio.timeout(WAIT):
        _, reader = await _open_stream(peer)
        messages = [m async for m in _messages(reader)]
    assert [m.get("method", "result" in m) for m in messages] == ["notifications/progress", True]
    assert len(reader.event_ids) == len(messages) + primed
    assert len(set(reader.event_ids)) == len(reader.event_ids)
    heads = {event_id.rpartition(".")[0] for event_id in reader.event_ids}
    assert len(heads) == 1  # one sealed head per stream, then a sequence number
    assert [int(e.rpartition(".")[2]) for e in reader.event_ids] == list(range(1, len(reader.event_ids) + 1))


async def test_a_plain_json_reply_carries_no_id(make_proxy: MakeProxy) -> None:
    peer = await (await make_proxy()).connect()
    _, response = await peer.send("tools/list")
    assert response.content_type == "application/json"


async def test_a_client_resuming_a_broken_stream_gets_its_requests_error_at_once(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = _progress_then_hang
    proxy = await make_proxy()
    peer = await proxy.connect()
    async with asyncio.timeout(WAIT):
        response, reader = await _open_stream(peer)
        assert (await reader.message())["method"] == "notifications/progress"
        response.close()  # the stream breaks (a replica died, a connection was cut)
        resumed = await peer.get_stream({"Last-Event-ID": reader.event_ids[-1]})
        assert resumed.status == 200 and resumed.content_type == "text/event-stream"
        messages = [m async for m in _messages(SseReader(resumed))]
    [error] = messages
    assert error["id"] == 41
    assert error["error"]["code"] == -32603
    assert error["error"]["data"]["reason"] == "stream_lost"
    assert "outcome upstream is unknown" in error["error"]["message"]
    metric = proxy.app[METRICS].registry.get_sample_value
    assert metric("mcp_era_proxy_streams_resumed_total", {"outcome": "lost"}) == 1


@pytest.mark.parametrize(
    "tamper",
    [
        lambda e: e.rpartition(".")[0][:-3] + "AAA." + e.rpartition(".")[2],
        lambda e: e.rpartition(".")[0],
        lambda e: e + "x",
        lambda e: "evt-7",
        lambda e: "",
    ],
    ids=["head-changed", "no-sequence", "bad-sequence", "foreign", "empty"],
)
async def test_a_last_event_id_not_of_this_session_is_refused(
    make_proxy: MakeProxy, fake: FakeModern, tamper: Any
) -> None:
    fake.handlers["tools/call"] = _progress_then_answer
    proxy = await make_proxy()
    peer = await proxy.connect()
    _, reader = await _open_stream(peer)
    _ = [m async for m in _messages(reader)]
    other = await proxy.connect()
    for session, last in ((peer, tamper(reader.event_ids[-1])), (other, reader.event_ids[-1])):
        response = await session.get_stream({"Last-Event-ID": last})
        assert response.status == 400, last
        body = await response.json()
        assert body["error"]["code"] == -32600
        assert "Last-Event-ID" in body["error"]["message"]


async def _messages(reader: SseReader) -> Any:
    while (message := await reader.message()) is not None:
        yield message


async def test_a_quiet_call_still_running_after_a_second_opens_its_stream_with_an_id(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    released = asyncio.Event()

    async def quiet(call: Call) -> Outcome:
        await released.wait()
        return complete(content=[{"type": "text", "text": "done"}])

    fake.handlers["tools/call"] = quiet
    peer = await (await make_proxy()).connect("2025-11-25")
    async with asyncio.timeout(WAIT):
        _, response = await peer.send("tools/call", {"name": "slow", "arguments": {}}, id=9)
        assert response.content_type == "text/event-stream"  # the headers came before the result
        first = await response.content.readuntil(b"\n\n")
        released.set()
        reader = SseReader(response)
        final = await reader.message()
    assert first.startswith(b"id: ") and b"\ndata: \n" in first  # the priming event: an id, no data
    assert final is not None and final["id"] == 9 and "result" in final
