"""A reply lives exactly as long as its handler: nothing is written to a connection after the
handler answered, so the next request on a kept-alive connection gets its own reply."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.protocol import jsonrpc
from tests.integration.conftest import MakeProxy
from tests.support.fake_modern import Call, FakeModern, Outcome, Reply, complete, notification

WAIT = 5.0


def content_type(response: Any) -> str:
    return response.headers.get("Content-Type", "").split(";")[0]


async def test_a_batch_item_that_needs_its_own_status_cancels_its_siblings_and_the_next_request_gets_its_own_reply(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """An upstream 401 for one item of a 2025-03-26 batch is answered with its status (so the
    client can authenticate). Its sibling must not outlive that answer: left running, its later
    progress was written onto the kept-alive connection and read as the reply to the next request."""
    proxy = await make_proxy(**{"streams.keepalive_s": 30})
    release, arrived = asyncio.Event(), asyncio.Event()
    slow_calls: list[Call] = []

    async def tool(call: Call) -> Outcome:
        if call.params.get("name") == "auth":
            await arrived.wait()  # refused once the sibling runs upstream
            return Reply(status=401, body="no", content_type="text/plain", headers={"WWW-Authenticate": "Bearer"})
        slow_calls.append(call)
        arrived.set()
        await release.wait()
        token = call.meta["progressToken"]
        await call.send(notification("notifications/progress", {"progressToken": token, "progress": 1}))
        return complete(content=[{"type": "text", "text": "late"}])

    fake.handlers["tools/call"] = tool
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect("2025-03-26")
        response = await peer.post(
            [
                jsonrpc.request(1, "tools/call", {"name": "auth", "arguments": {}}),
                jsonrpc.request(2, "tools/call", {"name": "slow", "arguments": {}, "_meta": {"progressToken": "p"}}),
            ]
        )
        assert response.status == 401
        metadata = proxy.client.make_url("/.well-known/oauth-protected-resource/mcp")
        assert response.headers["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata}"'  # the proxy's
        await response.read()
        release.set()
        await slow_calls[0].done.wait()  # cancelled, or (the defect) finished writing
        after = await peer.post(jsonrpc.request(3, "ping"))
        assert (after.status, content_type(after)) == (200, "application/json")
        assert json.loads(await after.read()) == jsonrpc.result_response(3, {})
    assert slow_calls[0].cancelled.is_set()  # its upstream call was cancelled, not abandoned


async def test_a_handler_that_fails_unexpectedly_leaves_no_keepalive_behind(
    make_proxy: MakeProxy, fake: FakeModern, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that may turn into a kept-alive SSE stream arms a timer; a failure other than a
    ProxyError below the handler (a bug) must not leave it armed: when it fired, it wrote an SSE
    response onto the connection, which the next request then read as its reply."""
    keepalive_s = 0.02
    proxy = await make_proxy(**{"streams.keepalive_s": keepalive_s})

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug below the handler")

    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        monkeypatch.setattr(proxy.relay, "handle_request", broken)
        failed = await peer.post(jsonrpc.request(1, "tools/list"))
        assert failed.status == 500
        assert json.loads(await failed.read())["error"]["code"] == jsonrpc.INTERNAL_ERROR
        monkeypatch.undo()
        # Long enough for a leaked keep-alive timer to fire (what this test guards against can only
        # happen after the handler ended, so there is nothing to wait for instead).
        await asyncio.sleep(keepalive_s * 10)
        after = await peer.post(jsonrpc.request(2, "ping"))
        assert (after.status, content_type(after)) == (200, "application/json")
        assert json.loads(await after.read()) == jsonrpc.result_response(2, {})
