"""LegacyCall, the executor of a ParkedCall (proxy/relay/legacy_call.py): what a call makes only once
it needs it (the wakeup of a waiting handler, its own tasks, the task-known event), and what it
frees once its upstream side is over."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.protocol import jsonrpc
from proxy.protocol.parked_call import DownstreamRequest, ParkedCall, RelayToClient, ReplyClient
from proxy.relay.legacy_call import LegacyCall
from proxy.upstream.legacy_session import LegacyUpstreamSession
from tests.unit.upstream.test_legacy_session import MemoryTransport, Owner

JSONDict = dict[str, Any]
PROGRESS = jsonrpc.notification("notifications/progress", {"progressToken": "p7", "progress": 1})


class Pool:
    def __init__(self) -> None:
        self.released: list[LegacyUpstreamSession] = []

    async def replace(self, session: LegacyUpstreamSession) -> LegacyUpstreamSession:
        raise AssertionError("not replaced here")

    def release(self, session: LegacyUpstreamSession) -> None:
        self.released.append(session)


class Relay:
    """The relay as a call sees it (CallOwner): records what the call tells it."""

    name = "memory"
    request_timeout_s = 30.0

    def __init__(self) -> None:
        self.pool = Pool()
        self.unparked: list[LegacyCall] = []
        self.forgotten: list[tuple[LegacyCall, bool]] = []

    def count_reinitialized(self) -> None:
        pass

    def unpark(self, call: LegacyCall) -> None:
        self.unparked.append(call)

    def forget(self, call: LegacyCall) -> None:
        self.forgotten.append((call, call.busy))


def new_call(relay: Relay, *, interactive: bool = False, token: str | None = "p7") -> LegacyCall:
    session = LegacyUpstreamSession(MemoryTransport(), ("alice", "{}"), {}, {}, Owner(), initialize_timeout_s=5.0)
    machine = ParkedCall.new(
        method="tools/call",
        params={"name": "echo", "_meta": {"progressToken": "t1"}},
        capabilities={"elicitation": {}} if interactive else {},
        downstream=DownstreamRequest("f1", "t1" if token else None, None),
        principal="alice",
        park_id="park-1",
        upstream="memory",
        upstream_id=7,
        server_info=None,
        cache_hint=None,
        collect_window_s=0.1,
        detach_timeout_s=30.0,
    )
    call = LegacyCall(relay, session, machine, interactive=interactive, upstream_token=token, trace={})
    call.bind(session)
    return call


async def test_a_call_answered_at_once_makes_no_event_and_no_task_scope():
    relay = Relay()
    call = new_call(relay)
    session = call.session
    call.feed(call.machine.upstream_message(jsonrpc.result_response(7, {"content": []})))
    assert call.finished and [type(action) for action in call.outbox] == [ReplyClient]
    assert call._wakeup is None and call._tasks is None and call._task_known is None
    assert not call.busy
    # Its session is free again: no route, no call on it, released, and the relay forgot the call.
    assert "p7" not in session.progress_routes and call not in session.active
    assert relay.pool.released == [session] and relay.unparked == [call] and relay.forgotten == [(call, False)]


async def test_a_handler_that_waits_is_woken_by_the_actions_fed_after_its_first_wait():
    relay = Relay()
    call = new_call(relay, interactive=True)
    assert call.session.exclusive is call
    waiting = asyncio.create_task(call.wakeup.wait())  # the Event is made here, at the first wait
    await asyncio.sleep(0)
    assert call._wakeup is not None and not waiting.done()
    call.feed(call.machine.upstream_message(PROGRESS))
    await asyncio.wait_for(waiting, 1.0)
    assert [type(action) for action in call.outbox] == [RelayToClient]
    assert call.wakeup is call._wakeup  # one Event, made once


async def test_an_answer_to_the_server_runs_in_a_task_scope_made_for_it():
    relay = Relay()
    call = new_call(relay)
    transport = call.session.transport
    assert isinstance(transport, MemoryTransport)
    ping = jsonrpc.request(3, "ping")
    call.feed(call.machine.upstream_message(ping))
    assert call._tasks is not None and call.busy
    await call.tasks.drain()
    assert not call.busy and transport.sent == [jsonrpc.result_response(3, {})]


async def test_the_task_known_event_is_made_once_and_can_be_replaced():
    call = new_call(Relay())
    known = call.task_known
    assert call.task_known is known and not known.is_set()
    other = asyncio.Event()
    call.task_known = other
    assert call.task_known is other
