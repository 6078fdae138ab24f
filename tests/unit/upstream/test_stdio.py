"""StdioChannel's routing of what a server writes (proxy/upstream/stdio.py), over a stand-in process
whose output the test writes itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from proxy.protocol import jsonrpc
from proxy.upstream.stdio import StdioChannel

JSONDict = dict[str, Any]
WAIT = 2.0


class Process:
    """A stand-in StdioProcess: `emit` is what the server writes."""

    def __init__(self, *, on_message: Callable[[JSONDict], None], on_exit: Callable[[int | None], None]) -> None:
        self.emit = on_message
        self.written: list[JSONDict] = []
        self.running = True

    async def start(self) -> None:
        pass

    async def write(self, message: JSONDict) -> None:
        self.written.append(message)

    async def stop(self, grace_s: float = 5.0) -> int | None:
        return 0


def channel(*, modern: bool) -> tuple[StdioChannel, Process, list[JSONDict]]:
    unsolicited: list[JSONDict] = []
    made: list[Process] = []

    def make(**callbacks: Any) -> Process:
        made.append(Process(**callbacks))
        return made[-1]

    return StdioChannel(make, "up", on_unsolicited=unsolicited.append, modern=modern), made[0], unsolicited


async def test_a_legacy_servers_cancellation_names_its_own_request_and_ends_none_of_ours() -> None:
    """Before 2026-07-28 either side cancels only requests it sent itself (2025-11-25
    basic/utilities/cancellation.mdx), and each side numbers its requests on its own: the server's
    request 2 (an elicitation it gave up on) is not the proxy's request 2."""
    stdio, process, unsolicited = channel(modern=False)
    route = stdio.open_route(jsonrpc.request(2, "tools/call", {"name": "slow"}))
    cancelled = jsonrpc.notification("notifications/cancelled", {"requestId": 2, "reason": "timed out"})
    process.emit(cancelled)
    assert unsolicited == [cancelled]  # to the call that the server's requests go to
    assert route.queue.empty()
    reply = jsonrpc.result_response(2, {"content": []})
    process.emit(reply)
    async with asyncio.timeout(WAIT):
        assert [message async for message in route.messages()] == [reply]


@pytest.mark.parametrize("request_id", [2, "listen-1"])
async def test_a_modern_servers_cancellation_ends_the_request_it_names(request_id: Any) -> None:
    """A 2026-07-28 server sends no requests: its notifications/cancelled ends one of the client's
    (a listen, when it shuts down)."""
    stdio, process, unsolicited = channel(modern=True)
    route = stdio.open_route(jsonrpc.request(request_id, "subscriptions/listen", {}))
    process.emit(jsonrpc.notification("notifications/cancelled", {"requestId": request_id}))
    async with asyncio.timeout(WAIT):
        assert [message async for message in route.messages()] == [
            jsonrpc.result_response(request_id, {"resultType": "complete"})
        ]
    assert unsolicited == []
