"""LegacyCall, the executor of a ParkedCall (proxy/relay/legacy_call.py): what a call makes only once
it needs it (the wakeup of a waiting handler, its own tasks, the task-known event), and what it
frees once its upstream side is over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from proxy.errors import ProxyError
from proxy.protocol import jsonrpc
from proxy.protocol.parked_call import DownstreamRequest, ParkedCall, RelayToClient, ReplyClient
from proxy.relay.legacy_call import LegacyCall, close_after
from proxy.upstream.errors import UpstreamSessionGone, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.legacy_session import LegacyUpstreamSession
from tests.unit.upstream.test_legacy_session import MemoryTransport, Messages, Owner

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


# ------------------------------------------------------------ opening the call's exchange


class FailingTransport(MemoryTransport):
    """Fails entering the first `len(failures)` exchanges, one exception each, then answers; counts
    the exchanges left."""

    def __init__(self, *failures: BaseException) -> None:
        super().__init__()
        self.failures = list(failures)
        self.left = 0

    @asynccontextmanager
    async def exchange(self, message: JSONDict, headers: Mapping[str, str]) -> AsyncIterator[Messages]:
        if self.failures:
            raise self.failures.pop(0)
        try:
            async with super().exchange(message, headers) as reply:
                yield reply
        finally:
            self.left += 1


class Reopening(Relay):
    """A relay whose pool opens the session again, and counts it."""

    def __init__(self, replacement: LegacyUpstreamSession | None) -> None:
        super().__init__()
        self.replacement = replacement
        self.reinitialized = 0
        self.pool.replace = self._replace  # type: ignore[method-assign]

    async def _replace(self, session: LegacyUpstreamSession) -> LegacyUpstreamSession:
        if self.replacement is None:
            raise ProxyError(jsonrpc.UPSTREAM_UNAVAILABLE, "initialize refused")
        return self.replacement

    def count_reinitialized(self) -> None:
        self.reinitialized += 1


def on(transport: MemoryTransport) -> LegacyUpstreamSession:
    return LegacyUpstreamSession(transport, ("alice", "{}"), {}, {}, Owner(), initialize_timeout_s=5.0)


def with_session(relay: Relay, session: LegacyUpstreamSession) -> LegacyCall:
    call = new_call(relay)
    call.session.progress_routes.clear()
    call.session.active.clear()
    call.bind(session)
    return call


OUTGOING = jsonrpc.request(7, "tools/call", {"name": "echo"})


async def test_open_sends_the_request_and_leaves_its_exchange_to_the_caller():
    transport = FailingTransport()
    call = with_session(Relay(), on(transport))
    exchange, reply = await call.open(OUTGOING)
    assert transport.sent == [OUTGOING]
    assert [message async for message in reply] == [jsonrpc.result_response(7, {})]
    assert transport.left == 0  # entered by hand: open does not leave it
    await exchange.__aexit__(None, None, None)
    assert transport.left == 1


async def test_a_request_that_cannot_be_sent_fails_as_an_unavailable_upstream():
    call = with_session(Relay(), on(FailingTransport(ValueError("not encodable"))))
    with pytest.raises(UpstreamUnavailable) as raised:
        await call.open(OUTGOING)
    assert raised.value.failure.message == "upstream 'memory' could not be sent the request (ValueError)"


@pytest.mark.parametrize("failure", [UpstreamTimeout("memory", "timed out"), TimeoutError()])
async def test_an_upstream_error_or_a_deadline_on_sending_keeps_its_own_meaning(failure: BaseException):
    call = with_session(Relay(), on(FailingTransport(failure)))
    with pytest.raises(type(failure)) as raised:
        await call.open(OUTGOING)
    assert raised.value is failure


async def test_a_forgotten_session_is_opened_again_and_the_request_sent_once_more():
    replacement = MemoryTransport()
    relay = Reopening(on(replacement))
    call = with_session(relay, on(FailingTransport(UpstreamSessionGone("memory", "forgot"))))
    exchange, _reply = await call.open(OUTGOING)
    assert call.session is relay.replacement and replacement.sent == [OUTGOING] and relay.reinitialized == 1
    await exchange.__aexit__(None, None, None)


async def test_a_session_forgotten_twice_fails_as_gone():
    gone = UpstreamSessionGone("memory", "forgot again")
    relay = Reopening(on(FailingTransport(gone)))
    call = with_session(relay, on(FailingTransport(UpstreamSessionGone("memory", "forgot"))))
    with pytest.raises(UpstreamSessionGone) as raised:
        await call.open(OUTGOING)
    assert raised.value is gone and relay.reinitialized == 1


async def test_a_session_that_cannot_be_opened_again_is_still_gone():
    call = with_session(Reopening(None), on(FailingTransport(UpstreamSessionGone("memory", "forgot"))))
    with pytest.raises(UpstreamSessionGone, match="forgot the session: initialize refused"):
        await call.open(OUTGOING)


async def test_a_handed_over_exchange_is_left_once_the_calls_tasks_are_done():
    transport = FailingTransport()
    call = with_session(Relay(), on(transport))
    exchange, _reply = await call.open(OUTGOING)
    gate = asyncio.Event()
    call.tasks.spawn(gate.wait(), name="answer-server")
    closing = asyncio.create_task(close_after(call, exchange))
    await asyncio.sleep(0.01)
    assert transport.left == 0  # the call still tells the upstream what it has to
    gate.set()
    await asyncio.wait_for(closing, 1.0)
    assert transport.left == 1
