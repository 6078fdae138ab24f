"""A legacy upstream session and its pool, over an in-memory transport: the calls running on a
session (its CallSinks) and how the pool shares sessions around them (proxy/upstream/legacy_session.py;
docs/translation.md §4.3)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from proxy.config import PoolConfig
from proxy.errors import ProxyError
from proxy.protocol import jsonrpc
from proxy.protocol.capabilities import modern_server_capabilities
from proxy.upstream.legacy_session import CallSink, LegacyUpstreamSession, SessionPool
from proxy.upstream.session_transports import CarriedSession

JSONDict = dict[str, Any]
INITIALIZED = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "legacy", "version": "1"}}


class Messages:
    """A reply: the messages given, then its end."""

    status = 200
    headers: Mapping[str, str] = {}

    def __init__(self, *messages: JSONDict) -> None:
        self._messages = messages

    async def __aiter__(self) -> AsyncIterator[JSONDict]:
        for message in self._messages:
            yield message


class MemoryTransport:
    """A server that answers every request with an empty result, and records what it is sent."""

    name = "memory"

    def __init__(self) -> None:
        self.sent: list[JSONDict] = []
        self.ended = False

    async def start(self, session: CarriedSession, hello: JSONDict) -> JSONDict | None:
        return None

    def headers(self, session: CarriedSession) -> dict[str, str]:
        return {}

    @asynccontextmanager
    async def exchange(self, message: JSONDict, headers: Mapping[str, str]) -> AsyncIterator[Messages]:
        self.sent.append(message)
        result = INITIALIZED if message["method"] == "initialize" else {}
        yield Messages(jsonrpc.result_response(message["id"], result))

    async def send(self, message: JSONDict, headers: Mapping[str, str]) -> None:
        self.sent.append(message)

    def adopt(self, session: CarriedSession, reply: Any) -> None:
        pass

    async def open_push(self, session: CarriedSession, wait_s: float) -> bool:
        return True

    async def end(self, session: CarriedSession, *, delete: bool) -> None:
        self.ended = True


class Owner:
    def __init__(self) -> None:
        self.requests: list[JSONDict] = []
        self.notes: list[JSONDict] = []

    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None:
        self.requests.append(request)

    def on_notification(self, session: LegacyUpstreamSession, note: JSONDict) -> None:
        self.notes.append(note)


class Call:
    """A call as the relay runs one: it implements CallSink."""

    def __init__(self) -> None:
        self.finished = False

    def takes(self, request: JSONDict) -> bool:
        return True


def factory(key: tuple[str, str], capabilities: JSONDict, auth_headers: dict[str, str], owner: Any):
    return LegacyUpstreamSession(MemoryTransport(), key, capabilities, auth_headers, owner, initialize_timeout_s=5.0)


def pool() -> SessionPool:
    return SessionPool("memory", PoolConfig(), Owner(), factory)


def bind(session: LegacyUpstreamSession, call: CallSink, token: str) -> None:
    session.active.add(call)
    session.progress_routes[token] = call
    session.exclusive = call


async def test_a_new_session_has_no_call_on_it():
    session = await pool().acquire("alice", {}, None, {}, exclusive=False)
    assert session.version == "2025-06-18"
    assert (session.exclusive, session.active, session.progress_routes) == (None, set(), {})


def test_a_session_reads_its_servers_capabilities_and_info_from_its_initialize_result_as_it_is_set():
    session = factory(("alice", "{}"), {}, {}, Owner())
    assert (session.server_capabilities, session.modern_capabilities, session.server_info) == ({}, {}, None)
    session.initialize_result = {**INITIALIZED, "capabilities": {"tools": {"listChanged": True}, "logging": {}}}
    assert session.server_capabilities == {"tools": {"listChanged": True}, "logging": {}}
    assert session.modern_capabilities == modern_server_capabilities(session.server_capabilities)
    assert session.server_info == {"name": "legacy", "version": "1"}
    assert not session.tool_calls_as_tasks
    session.initialize_result = {**INITIALIZED, "capabilities": [], "serverInfo": "not an object"}
    assert (session.server_capabilities, session.server_info) == ({}, None)


def test_a_session_knows_once_whether_its_server_takes_task_augmented_tool_calls():
    session = factory(("alice", "{}"), {}, {}, Owner())
    tasks = {"tasks": {"requests": {"tools": {"call": {}}}}}
    session.initialize_result = {**INITIALIZED, "capabilities": tasks}
    assert session.tool_calls_as_tasks
    session.initialize_result = {**INITIALIZED, "capabilities": {"tasks": {"list": {}}}}
    assert not session.tool_calls_as_tasks


async def test_a_session_hands_what_the_server_starts_to_its_owner():
    owner = Owner()
    session = factory(("alice", "{}"), {}, {}, owner)
    session.dispatch(jsonrpc.request(1, "roots/list"))
    session.dispatch(jsonrpc.notification("notifications/progress", {"progressToken": "p", "progress": 1}))
    session.dispatch(jsonrpc.result_response(2, {}))  # a reply is no one's: dropped
    assert [m["method"] for m in owner.requests] == ["roots/list"]
    assert [m["method"] for m in owner.notes] == ["notifications/progress"]


async def test_a_session_an_interactive_call_holds_is_shared_only_with_calls_that_are_not():
    sessions = pool()
    held = await sessions.acquire("alice", {}, None, {}, exclusive=True)
    call = Call()
    bind(held, call, "p1")
    assert await sessions.acquire("alice", {}, None, {}, exclusive=False) is held
    other = await sessions.acquire("alice", {}, None, {}, exclusive=True)
    assert other is not held and other.exclusive is None
    held.exclusive = None
    sessions.release(held)
    sessions.release(held)
    sessions.release(other)
    assert await sessions.acquire("alice", {}, None, {}, exclusive=True) is held


async def test_a_session_the_upstream_forgot_is_replaced_with_its_interactive_call_still_on_it():
    sessions = pool()
    session = await sessions.acquire("alice", {}, None, {}, exclusive=True)
    call = Call()
    bind(session, call, "p1")
    fresh = await sessions.replace(session)
    assert session.closed and fresh is not session
    assert fresh.exclusive is call and fresh.inflight == 1
    assert len(sessions) == 1


async def test_idle_sessions_are_evicted_but_not_one_an_interactive_call_holds():
    sessions = SessionPool("memory", PoolConfig(max_sessions=1), Owner(), factory)
    held = await sessions.acquire("alice", {}, None, {}, exclusive=True)
    bind(held, Call(), "p1")
    sessions.release(held)
    with pytest.raises(ProxyError, match="maximum of upstream sessions"):
        await sessions.acquire("bob", {}, None, {}, exclusive=False)
    held.exclusive = None
    bob = await sessions.acquire("bob", {}, None, {}, exclusive=False)
    assert held.closed and len(sessions) == 1 and bob.key[0] == "bob"
