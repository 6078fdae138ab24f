"""Replicas behind a balancer: the echo of a token reaches the replica that holds what it names.

Real proxy apps on loopback ports, each with its own internal listener (proxy/cluster/), one
shared secret, and (for legacy sessions) one shared session store object, which is what a shared
store gives replicas. Upstreams are the scripted fakes of the other integration tests.

- a modern client's retry (requestState) of a call parked on replica A, sent to replica B, is
  replayed on A and its reply (JSON or SSE) comes back through B; A gone: a prompt -32603;
- a legacy client's answer to a server-to-client request A sent, posted to B, resolves A's wait;
- the internal listener serves only what this proxy sealed for that very process.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from proxy.app import FORWARDER, INTERNAL, METRICS, create_app
from proxy.cluster.envelope import REFUSED_HEADER, REPLAY_PATH, TARGET_HEADER, Envelope, seal_envelope
from proxy.cluster.owners import new_boot_id
from proxy.config import Settings, load_settings
from proxy.downstream.server import runner as make_runner
from proxy.protocol import jsonrpc
from proxy.state.sealing import Sealer
from proxy.state.sessions import InMemorySessionStore, SessionStore
from proxy.tracing import Tracing
from proxy.tracing.otel import OtelTracing
from tests.integration.conftest import serve
from tests.support import fake_legacy, fake_modern
from tests.support.fake_legacy import Call, FakeLegacy
from tests.support.fake_modern import FakeModern, complete, input_required
from tests.support.jwt_issuer import JwtIssuer
from tests.support.legacy_client import LegacyClient
from tests.support.legacy_sse_client import sse_client as legacy_sse_client
from tests.support.mcp_client import McpReply, SseReader
from tests.support.modern_client import ModernClient

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for
SECRET = "replicas-share-this-secret-0123456789"
CONNECT_TIMEOUT_S = 0.3
LOST_WITHIN_S = 3.0  # a dead owner is reported within this (connect timeout and a refusal are far below)
ELICIT_PARAMS: JSONDict = {
    "mode": "form",
    "message": "Deploy to production?",
    "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
}
ACCEPTED: JSONDict = {"action": "accept", "content": {"confirm": True}}
DEPLOY: JSONDict = {"name": "deploy", "arguments": {"env": "prod"}}
LOST = {
    "code": jsonrpc.INTERNAL_ERROR,
    "message": "the proxy replica holding the parked call is gone; the call must be re-issued",
    "data": {"reason": "upstream_call_lost", "reissue": True},
}


@dataclass
class Replica:
    app: web.Application
    http: TestClient
    settings: Settings
    internal: web.AppRunner | None
    internal_port: int

    @property
    def boot(self) -> str:
        return self.app[FORWARDER].owner.boot

    def modern(self, authorization: str = "Bearer alice") -> ModernClient:
        return ModernClient(self.http, headers={"Authorization": authorization})

    def forwards(self, kind: str, outcome: str) -> float:
        value = self.app[METRICS].registry.get_sample_value(
            "mcp_era_proxy_forwards_total", {"kind": kind, "outcome": outcome}
        )
        return value or 0.0

    async def stop(self) -> None:
        """The replica's process ends: both its listeners close."""
        if self.internal is not None:
            await self.internal.cleanup()
            self.internal = None
        await self.http.close()


MakeReplica = Callable[..., Awaitable[Replica]]


@pytest.fixture
async def make_replica(aiohttp_server: Any, aiohttp_client: Any) -> AsyncIterator[MakeReplica]:
    """`await make_replica(upstream_url, era, store=..., internal_port=..., start_internal=True)`."""
    started: list[Replica] = []
    # Each replica's internal address is in its settings before it listens: a socket bound here
    # holds the port until then (listened on by the replica, or left closed to refuse connections).
    held: list[socket.socket] = []

    async def build(
        upstream_url: str,
        era: str,
        *,
        store: SessionStore | None = None,
        internal_port: int | None = None,
        start_internal: bool = True,
        tracing: Tracing | None = None,
        **overrides: Any,
    ) -> Replica:
        sock: socket.socket | None = None
        if internal_port is None or start_internal:
            sock = socket.socket()
            held.append(sock)
            # A given port is one a stopped replica held: its successor takes it over.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", internal_port or 0))
        port = internal_port or sock.getsockname()[1]  # type: ignore[union-attr]
        settings = load_settings(
            None,
            **{
                "upstream.url": upstream_url,
                "upstream.name": "fake-upstream",
                "upstream.era": era,
                "cache.watch": False,
                "security.secret": SECRET,
                "replicas.internal_listen": f"127.0.0.1:{port}",
                "replicas.forward_connect_timeout_s": CONNECT_TIMEOUT_S,
                # A replica stopped here stands for one that died: nothing waits for its calls.
                "shutdown.grace_s": 0.1,
                **overrides,
            },
        )
        app, _ = create_app(settings, store=store, tracing=tracing)
        server = await serve(aiohttp_server, app)
        internal: web.AppRunner | None = None
        if start_internal:
            internal = make_runner(app[INTERNAL], settings)
            await internal.setup()
            assert sock is not None, "a replica with an internal listener of its own"
            await web.SockSite(internal, sock).start()
        replica = Replica(app, await aiohttp_client(server), settings, internal, port)
        started.append(replica)
        return replica

    yield build
    for replica in started:
        if replica.internal is not None:
            await replica.internal.cleanup()
    for sock in held:
        sock.close()


# ---------------------------------------------------------------------------- upstreams


@pytest.fixture
async def legacy_upstream(aiohttp_server: Any) -> AsyncIterator[FakeLegacy]:
    fake = FakeLegacy()
    server: TestServer = await serve(aiohttp_server, fake.app)
    fake.url = str(server.make_url(fake_legacy.PATH))
    yield fake
    problems = fake.protocol_problems()
    assert not problems, f"the proxy sent what a 2025-11-25 server must refuse: {problems}"


@pytest.fixture
async def modern_upstream(aiohttp_server: Any) -> FakeModern:
    fake = FakeModern()
    server: TestServer = await serve(aiohttp_server, fake.app)
    fake.url = str(server.make_url(fake_modern.PATH))
    return fake


async def confirm_then_deploy(call: Call) -> Any:
    answer = await call.ask("elicitation/create", ELICIT_PARAMS)
    return {"content": [{"type": "text", "text": f"deployed: {answer['result']['action']}"}]}


def retry(state: str, responses: JSONDict, params: JSONDict = DEPLOY) -> JSONDict:
    return {**copy.deepcopy(params), "inputResponses": responses, "requestState": state}


def parked_state(reply: McpReply) -> tuple[str, str]:
    """The requestState of an input_required result, and the key of its one input request."""
    assert reply.status == 200, reply.messages
    result = reply.result
    assert result["resultType"] == "input_required", result
    [key] = result["inputRequests"]
    return result["requestState"], key


async def park_on(a: Replica, fake: FakeLegacy) -> tuple[str, str, Any]:
    fake.handlers["tools/call"] = confirm_then_deploy
    state, key = parked_state(await a.modern().request("tools/call", DEPLOY))
    [upstream] = fake.calls_of("tools/call")
    return state, key, upstream


# ---------------------------------------------------------------------------- W6: parked calls


async def test_a_retry_landing_on_another_replica_resumes_the_call_parked_on_its_owner(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    async with asyncio.timeout(WAIT):
        state, key, upstream = await park_on(a, legacy_upstream)
        final = await b.modern().request("tools/call", retry(state, {key: ACCEPTED}))
    assert final.status == 200 and final.content_type == "application/json"
    assert final.result["resultType"] == "complete"
    assert final.result["content"] == [{"type": "text", "text": "deployed: accept"}]
    [asked] = upstream.asked
    assert asked.response.result()["result"] == ACCEPTED  # the user was asked once, and answered once
    assert legacy_upstream.calls_of("tools/call") == [upstream]  # resumed, never sent again
    assert b.forwards("resume", "ok") == 1 and a.forwards("resume", "ok") == 0


async def test_a_forwarded_retry_is_a_hop_of_the_clients_trace(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    """B's replay is a CLIENT span of B's request; A's span for the replayed request is its child."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    a = await make_replica(legacy_upstream.url, "legacy", tracing=OtelTracing(provider))
    b = await make_replica(legacy_upstream.url, "legacy", tracing=OtelTracing(provider))
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with asyncio.timeout(WAIT):
        state, key, _ = await park_on(a, legacy_upstream)
        exporter.clear()
        peer = ModernClient(b.http, headers={"Authorization": "Bearer alice", "traceparent": traceparent})
        final = await peer.request("tools/call", retry(state, {key: ACCEPTED}))
    assert final.result["resultType"] == "complete"
    spans = exporter.get_finished_spans()
    provider.shutdown()
    servers = [s for s in spans if s.kind is SpanKind.SERVER and s.name == "tools/call deploy"]
    (hop,) = [s for s in spans if s.kind is SpanKind.CLIENT and s.name == "replay resume"]
    assert hop.parent is not None and hop.context is not None
    on_b = next(s for s in servers if s.parent is not None and s.parent.span_id == 0xB7AD6B7169203331)
    on_a = next(s for s in servers if s is not on_b)
    assert on_b.context is not None and hop.parent.span_id == on_b.context.span_id
    assert on_a.parent is not None and on_a.parent.span_id == hop.context.span_id
    assert {s.context.trace_id for s in (on_a, on_b, hop) if s.context} == {0x0AF7651916CD43DD8448EB211C80319C}


async def test_a_retry_with_a_refreshed_token_on_another_replica_resumes_the_call_of_the_same_subject(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy, aiohttp_server: Any
) -> None:
    """The caller is (issuer, subject): the owner check on B and the parked call's binding on A
    both hold for a new token of the same subject, and A answers upstream with the new token."""
    issuer = JwtIssuer()
    issuer.url = str((await aiohttp_server(issuer.app)).make_url("")).rstrip("/")
    public = "https://mcp.example.com/mcp"
    auth = {"auth.issuers": [issuer.issuer], "auth.jwks_url": issuer.jwks_url, "auth.public_url": public}
    a = await make_replica(legacy_upstream.url, "legacy", **auth)
    b = await make_replica(legacy_upstream.url, "legacy", **auth)
    legacy_upstream.handlers["tools/call"] = confirm_then_deploy
    first, refreshed = issuer.mint(aud=public), issuer.mint(aud=public)
    async with asyncio.timeout(WAIT):
        state, key = parked_state(await a.modern(f"Bearer {first}").request("tools/call", DEPLOY))
        stranger = await b.modern(f"Bearer {issuer.mint(aud=public, sub='bob')}").request(
            "tools/call", retry(state, {key: ACCEPTED})
        )
        assert stranger.status == 400 and stranger.error["code"] == jsonrpc.INVALID_PARAMS
        final = await b.modern(f"Bearer {refreshed}").request("tools/call", retry(state, {key: ACCEPTED}))
    assert final.status == 200 and final.result["content"] == [{"type": "text", "text": "deployed: accept"}]
    assert b.forwards("resume", "ok") == 1
    [answer] = legacy_upstream.responses
    assert answer.headers.get("Authorization") == f"Bearer {refreshed}"


async def test_a_forwarded_resume_whose_reply_streams_comes_back_as_the_same_sse_stream(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    async def confirm_then_report(call: Call) -> Any:
        answer = await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.progress(1, 2, "halfway")
        return {"content": [{"type": "text", "text": f"deployed: {answer['result']['action']}"}]}

    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    legacy_upstream.handlers["tools/call"] = confirm_then_report
    async with asyncio.timeout(WAIT):
        first = {**DEPLOY, "_meta": {"progressToken": "p-0"}}
        state, key = parked_state(await a.modern().request("tools/call", first))
        params = {**retry(state, {key: ACCEPTED}), "_meta": {"progressToken": "p-1"}}
        final = await b.modern().request("tools/call", params)
    assert final.content_type == "text/event-stream"
    assert final.headers.get("X-Accel-Buffering") == "no"
    [progress] = final.notes
    assert progress["method"] == "notifications/progress" and progress["params"]["progressToken"] == "p-1"
    assert final.result["content"] == [{"type": "text", "text": "deployed: accept"}]


async def test_a_forwarded_reply_is_streamed_as_it_comes_and_a_client_leaving_cancels_the_call_on_its_owner(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    """The progress reaches the client through B while the owner's call still runs (nothing is
    buffered); the client closing its stream on B closes the replay, which on A is the client
    going away: the upstream call is cancelled."""
    release = asyncio.Event()

    async def confirm_report_wait(call: Call) -> Any:
        await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.progress(1, 2, "halfway")
        await release.wait()
        return {"content": [{"type": "text", "text": "late"}]}

    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    legacy_upstream.handlers["tools/call"] = confirm_report_wait
    try:
        async with asyncio.timeout(WAIT):
            first = {**DEPLOY, "_meta": {"progressToken": "p-0"}}
            state, key = parked_state(await a.modern().request("tools/call", first))
            [upstream] = legacy_upstream.calls_of("tools/call")
            peer = b.modern()
            params = {**retry(state, {key: ACCEPTED}), "_meta": {"progressToken": "p-1"}}
            message, response = await peer.send("tools/call", params)
            stream = peer.stream(response, message)
            progress = await stream.next()
            assert progress is not None and progress["method"] == "notifications/progress"
            assert not upstream.cancelled.is_set()
            stream.close()
            await upstream.cancelled.wait()  # A saw its client (B's replay) go
    finally:
        release.set()


async def test_an_owner_dying_midway_through_a_forwarded_stream_ends_it_with_the_calls_error(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    """The forwarded reply is an SSE stream under way when A's internal listener goes (its handlers
    cut): B ends the stream after the last whole event with the request's -32603 call-lost error."""
    release = asyncio.Event()

    async def confirm_report_wait(call: Call) -> Any:
        await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.progress(1, 2, "halfway")
        await release.wait()
        return {"content": [{"type": "text", "text": "late"}]}

    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    legacy_upstream.handlers["tools/call"] = confirm_report_wait
    try:
        async with asyncio.timeout(WAIT):
            first = {**DEPLOY, "_meta": {"progressToken": "p-0"}}
            state, key = parked_state(await a.modern().request("tools/call", first))
            peer = b.modern()
            params = {**retry(state, {key: ACCEPTED}), "_meta": {"progressToken": "p-1"}}
            message, response = await peer.send("tools/call", params)
            stream = peer.stream(response, message)
            progress = await stream.next()
            assert progress is not None and progress["method"] == "notifications/progress"
            assert a.internal is not None
            await a.internal.cleanup()  # A's replays are cut, as when its process dies
            a.internal = None
            final = await stream.next()
            end = await stream.next()
    finally:
        release.set()
    assert final == {"jsonrpc": "2.0", "id": message["id"], "error": LOST}
    assert end is None
    assert b.forwards("resume", "owner_gone") == 1


async def test_a_retry_of_another_caller_is_not_forwarded_and_is_refused_as_an_invalid_state(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    async with asyncio.timeout(WAIT):
        state, key, upstream = await park_on(a, legacy_upstream)
        stolen = await b.modern("Bearer mallory").request("tools/call", retry(state, {key: ACCEPTED}))
    assert stolen.status == 400 and stolen.error["code"] == jsonrpc.INVALID_PARAMS
    assert b.forwards("resume", "ok") == 0
    assert not upstream.asked[0].response.done()  # still parked for its caller


async def _lost(b: Replica, state: str, key: str) -> McpReply:
    started = time.monotonic()
    reply = await b.modern().request("tools/call", retry(state, {key: ACCEPTED}))
    assert time.monotonic() - started < LOST_WITHIN_S
    return reply


def assert_call_lost(reply: McpReply) -> None:
    assert reply.status == 200 and reply.content_type == "application/json"
    assert reply.error == LOST


async def test_a_retry_whose_owner_is_gone_is_told_promptly_to_reissue_the_call(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    async with asyncio.timeout(WAIT):
        state, key, _ = await park_on(a, legacy_upstream)
        await a.stop()  # connection refused at its address now
        reply = await _lost(b, state, key)
    assert_call_lost(reply)
    assert b.forwards("resume", "owner_gone") == 1


async def test_a_retry_whose_owner_was_replaced_by_a_new_process_at_its_address_is_told_to_reissue(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    b = await make_replica(legacy_upstream.url, "legacy")
    async with asyncio.timeout(WAIT):
        state, key, _ = await park_on(a, legacy_upstream)
        await a.stop()
        successor = await make_replica(legacy_upstream.url, "legacy", internal_port=a.internal_port)
        assert successor.boot != a.boot
        reply = await _lost(b, state, key)
    assert_call_lost(reply)  # the successor answered 410: not its call
    assert b.forwards("resume", "owner_gone") == 1
    assert successor.forwards("resume", "ok") == 0


async def test_a_retry_whose_owner_does_not_accept_connections_is_told_to_reissue_after_the_connect_timeout(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    """The owner's address accepts no connection (a listener whose backlog is full drops SYNs):
    `replicas.forward_connect_timeout_s` bounds the wait."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(0)
        port = blackhole.getsockname()[1]
        fillers = []
        for _ in range(4):  # fill the backlog: later connection attempts go unanswered
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(filler)
        try:
            a = await make_replica(legacy_upstream.url, "legacy", internal_port=port, start_internal=False)
            b = await make_replica(legacy_upstream.url, "legacy")
            async with asyncio.timeout(WAIT):
                state, key, _ = await park_on(a, legacy_upstream)
                started = time.monotonic()
                reply = await _lost(b, state, key)
                elapsed = time.monotonic() - started
        finally:
            for filler in fillers:
                filler.close()
    assert_call_lost(reply)
    assert elapsed >= CONNECT_TIMEOUT_S * 0.9  # it did wait for the connection, no longer
    assert b.forwards("resume", "owner_gone") == 1


async def test_a_replay_its_owner_cannot_open_is_refused_and_the_client_told_to_reissue(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    """Mid-rotation, B minting with a secret A does not know yet: A refuses B's envelope (401),
    which B counts as refused, and the client still gets a clear answer at once."""
    old = "the-old-secret-of-the-replicas-0123"
    a = await make_replica(legacy_upstream.url, "legacy", **{"security.secret": old})
    b = await make_replica(
        legacy_upstream.url, "legacy", **{"security.secret": SECRET, "security.previous_secrets": [old]}
    )
    async with asyncio.timeout(WAIT):
        state, key, upstream = await park_on(a, legacy_upstream)
        reply = await _lost(b, state, key)
    assert_call_lost(reply)
    assert b.forwards("resume", "refused") == 1
    assert not upstream.asked[0].response.done()


async def test_a_retry_on_its_owner_is_served_there_without_forwarding(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    async with asyncio.timeout(WAIT):
        state, key, _ = await park_on(a, legacy_upstream)
        final = await a.modern().request("tools/call", retry(state, {key: ACCEPTED}))
    assert final.result["resultType"] == "complete"
    assert a.forwards("resume", "ok") == 0


# ---------------------------------------------------------------------------- W2: legacy answers


async def _legacy_pair(make_replica: MakeReplica, modern_upstream: FakeModern) -> tuple[Replica, Replica]:
    store = InMemorySessionStore()  # what a shared store gives every replica
    a = await make_replica(modern_upstream.url, "modern", store=store)
    b = await make_replica(modern_upstream.url, "modern", store=store)
    return a, b


def on(replica: Replica, peer: LegacyClient) -> LegacyClient:
    """The same legacy session, its next requests sent to `replica` (what a balancer does)."""
    return LegacyClient(replica.http, peer.version, peer.session_id, peer.base_headers, peer.initialize_result)


ELICIT = {"method": "elicitation/create", "params": ELICIT_PARAMS}


async def test_a_legacy_clients_answer_landing_on_another_replica_resolves_the_request_its_owner_sent(
    make_replica: MakeReplica, modern_upstream: FakeModern
) -> None:
    a, b = await _legacy_pair(make_replica, modern_upstream)
    scripted = [input_required({"confirm": ELICIT}, "state-1"), complete(content=[{"type": "text", "text": "done"}])]

    async def handler(call: Any) -> Any:
        return scripted.pop(0)

    modern_upstream.handlers["tools/call"] = handler
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(a.http, headers={"Authorization": "Bearer alice"})
        request_id, response = await peer.send("tools/call", DEPLOY)
        reader = SseReader(response)
        asked = await reader.message()
        assert asked is not None and asked["method"] == "elicitation/create", asked
        assert isinstance(asked["id"], str)  # sealed: it names replica A
        assert await on(b, peer).respond(asked["id"], ACCEPTED) == 202
        final = await reader.message()
    assert final == {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "done"}]}}
    [_, resumed] = modern_upstream.calls_of("tools/call")
    assert resumed.params["inputResponses"] == {"confirm": ACCEPTED}
    assert b.forwards("deliver", "ok") == 1


async def test_an_answer_inside_a_batch_landing_on_another_replica_is_delivered_to_its_owner(
    make_replica: MakeReplica, modern_upstream: FakeModern
) -> None:
    """2025-03-26 batches: each response in one is delivered where it is awaited."""
    a, b = await _legacy_pair(make_replica, modern_upstream)
    sample = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 8}}
    scripted = [input_required({"draft": sample}, "state-1"), complete(content=[{"type": "text", "text": "done"}])]

    async def handler(call: Any) -> Any:
        return scripted.pop(0)

    modern_upstream.handlers["tools/call"] = handler
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(a.http, "2025-03-26", capabilities={"sampling": {}})
        request_id, response = await peer.send("tools/call", DEPLOY)
        reader = SseReader(response)
        asked = await reader.message()
        assert asked is not None and asked["method"] == "sampling/createMessage", asked
        sampled = {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}
        batch = [{"jsonrpc": "2.0", "id": asked["id"], "result": sampled}]
        answered = await on(b, peer).post(batch)
        assert answered.status == 202
        final = await reader.message()
    assert final is not None and final["id"] == request_id and "result" in final, final
    [_, resumed] = modern_upstream.calls_of("tools/call")
    assert resumed.params["inputResponses"] == {"draft": sampled}
    assert b.forwards("deliver", "ok") == 1


async def test_a_legacy_clients_answer_for_a_replica_that_is_gone_is_accepted_and_counted(
    make_replica: MakeReplica, modern_upstream: FakeModern
) -> None:
    a, b = await _legacy_pair(make_replica, modern_upstream)

    async def ask(call: Any) -> Any:
        return input_required({"confirm": ELICIT}, "s")

    modern_upstream.handlers["tools/call"] = ask
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(a.http)
        _, response = await peer.send("tools/call", DEPLOY)
        asked = await SseReader(response).message()
        assert asked is not None and isinstance(asked["id"], str)
        response.close()
        await a.stop()
        started = time.monotonic()
        assert await on(b, peer).respond(asked["id"], ACCEPTED) == 202
    assert time.monotonic() - started < LOST_WITHIN_S
    assert b.forwards("deliver", "owner_gone") == 1


async def test_an_answer_whose_id_the_proxy_did_not_seal_is_accepted_and_not_forwarded(
    make_replica: MakeReplica, modern_upstream: FakeModern
) -> None:
    _, b = await _legacy_pair(make_replica, modern_upstream)
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(b.http)
        for forged in ("not-a-token", 7, "A" * 200):
            assert await peer.respond(forged, ACCEPTED) == 202
    assert b.forwards("deliver", "ok") == b.forwards("deliver", "owner_gone") == 0


# ---------------------------------------------------------------------------- the internal listener


async def _replay_read(
    replica: Replica, body: bytes, target: str | None = None
) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"http://127.0.0.1:{replica.internal_port}{REPLAY_PATH}",
            data=body,
            headers={TARGET_HEADER: target or replica.boot},
        ) as response:
            return response, await response.read()


async def _replay(replica: Replica, body: bytes, target: str | None = None) -> aiohttp.ClientResponse:
    return (await _replay_read(replica, body, target))[0]


def _envelope_for(
    replica: Replica, *, secret: str = SECRET, target: str | None = None, now: float | None = None
) -> bytes:
    """A replay of a modern client's tools/list, sealed for `target` (the replica's boot)."""
    peer = replica.modern()
    message = peer.message("tools/list")
    envelope = Envelope("POST", list(peer.headers(message).items()), json.dumps(message).encode())
    sealer = Sealer(secret.encode())
    return seal_envelope(sealer, target or replica.boot, envelope, time.time() if now is None else now).encode()


async def test_the_internal_listener_refuses_whatever_it_did_not_seal_for_this_process(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    good = _envelope_for(a)
    tampered = bytearray(good)
    tampered[30] = ord("A") if tampered[30] != ord("A") else ord("B")
    async with asyncio.timeout(WAIT):
        for body in (
            b"",
            b"{}",
            b"not sealed at all",
            bytes(tampered),
            _envelope_for(a, secret="another-secret-0123456789"),
        ):
            response = await _replay(a, body)
            assert response.status == 401 and response.headers[REFUSED_HEADER] == "unopenable", body
        expired = await _replay(a, _envelope_for(a, now=time.time() - 31))
        assert expired.status == 401
        other = new_boot_id()
        other_boot = await _replay(a, _envelope_for(a, target=other), target=other)
        assert other_boot.status == 410 and other_boot.headers[REFUSED_HEADER] == "other_boot"
        wrong_header = await _replay(a, good, target=new_boot_id())  # the boot is the envelope's aad
        assert wrong_header.status == 401
        served, body = await _replay_read(a, good)
        again = await _replay(a, good)  # a copy of an envelope served is someone replaying it
    assert served.status == 200 and REFUSED_HEADER not in served.headers
    assert json.loads(body)["result"]["tools"] == legacy_upstream.tools  # served as if sent to the endpoint
    assert again.status == 401 and again.headers[REFUSED_HEADER] == "replayed"


async def test_the_replay_endpoint_is_not_on_the_public_listener(
    make_replica: MakeReplica, legacy_upstream: FakeLegacy
) -> None:
    a = await make_replica(legacy_upstream.url, "legacy")
    response = await a.http.post(REPLAY_PATH, data=_envelope_for(a), headers={TARGET_HEADER: a.boot})
    assert response.status == 404
    assert "error" in json.loads(await response.read())


async def test_a_single_replica_without_an_internal_listener_never_forwards(
    aiohttp_server: Any, aiohttp_client: Any, legacy_upstream: FakeLegacy
) -> None:
    settings = load_settings(
        None, **{"upstream.url": legacy_upstream.url, "upstream.name": "u", "upstream.era": "legacy"}
    )
    app, _ = create_app(settings)
    assert INTERNAL not in app and not app[FORWARDER].enabled
    replica = Replica(app, await aiohttp_client(await serve(aiohttp_server, app)), settings, None, 0)
    async with asyncio.timeout(WAIT):
        state, key, _ = await park_on(replica, legacy_upstream)
        final = await replica.modern().request("tools/call", retry(state, {key: ACCEPTED}))
    assert final.result["resultType"] == "complete"


# ---------------------------------------------------------------------------- subscriptions and the GET stream


async def test_a_subscription_made_through_another_replica_changes_the_listen_of_the_stream_holder(
    make_replica: MakeReplica, modern_upstream: FakeModern, redis: Any
) -> None:
    a = await make_replica(modern_upstream.url, "modern", **{"store.url": redis.url})
    b = await make_replica(modern_upstream.url, "modern", **{"store.url": redis.url})
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(a.http)
        stream = await peer.get_stream()  # held by a
        await modern_upstream.wait_listen()
        reply = await on(b, peer).request("resources/subscribe", {"uri": "file:///watched"})
        assert reply.result == {}
        listen = await modern_upstream.wait_listen(
            lambda listen: "file:///watched" in (listen.filter.get("resourceSubscriptions") or ())
        )
        listen.push("notifications/resources/updated", {"uri": "file:///watched"})
        note = await SseReader(stream).message()
        stream.close()
    assert note == {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "file:///watched"}}
    assert b.forwards("subscribe", "ok") == 1


async def test_a_subscription_for_a_stream_holder_that_is_gone_is_made_where_it_lands(
    make_replica: MakeReplica, modern_upstream: FakeModern, redis: Any
) -> None:
    a = await make_replica(modern_upstream.url, "modern", **{"store.url": redis.url})
    b = await make_replica(modern_upstream.url, "modern", **{"store.url": redis.url})
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(a.http)
        stream = await peer.get_stream()
        await modern_upstream.wait_listen()
        stream.close()
        await a.stop()
        reply = await on(b, peer).request("resources/subscribe", {"uri": "file:///watched"})
        assert reply.result == {}
        moved = await on(b, peer).get_stream()  # the stream's next home listens for it
        await modern_upstream.wait_listen(
            lambda listen: "file:///watched" in (listen.filter.get("resourceSubscriptions") or ())
        )
        moved.close()
    assert b.forwards("subscribe", "owner_gone") == 1


# ---------------------------------------------------------------------------- an input round taken over


async def _asked_on(a: Replica, modern_upstream: FakeModern) -> tuple[LegacyClient, Any, str, str]:
    """A legacy client's tools/call on `a`, stopped at the elicitation it is asked: the peer, the
    broken stream's request id, the elicitation's id and the last event id the client saw."""
    scripted = [input_required({"confirm": ELICIT}, "state-1"), complete(content=[{"type": "text", "text": "done"}])]

    async def handler(call: Any) -> Any:
        return scripted.pop(0)

    modern_upstream.handlers["tools/call"] = handler
    peer = await LegacyClient.connect(a.http)
    request_id, response = await peer.send("tools/call", DEPLOY)
    reader = SseReader(response)
    asked = await reader.message()
    assert asked is not None and asked["method"] == "elicitation/create", asked
    response.close()  # the stream breaks: its replica is about to die
    return peer, request_id, asked["id"], reader.event_ids[-1]


async def _three(make_replica: MakeReplica, modern_upstream: FakeModern, redis: Any) -> list[Replica]:
    return [await make_replica(modern_upstream.url, "modern", **{"store.url": redis.url}) for _ in range(3)]


async def test_a_round_whose_replica_died_is_carried_on_where_the_client_resumes_its_stream(
    make_replica: MakeReplica, modern_upstream: FakeModern, redis: Any
) -> None:
    a, b, c = await _three(make_replica, modern_upstream, redis)
    async with asyncio.timeout(WAIT):
        peer, request_id, asked_id, last_event = await _asked_on(a, modern_upstream)
        await a.stop()
        resumed = await on(b, peer).get_stream({"Last-Event-ID": last_event})
        assert resumed.status == 200
        reader = SseReader(resumed)
        assert await on(c, peer).respond(asked_id, ACCEPTED) == 202  # lands on a third replica
        final = await reader.message()
    assert final == {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "done"}]}}
    [_, retried] = modern_upstream.calls_of("tools/call")
    assert retried.params["inputResponses"] == {"confirm": ACCEPTED}
    assert retried.params["requestState"] == "state-1"
    assert c.forwards("deliver", "ok") == 1  # to b, which carries the round on
    assert reader.event_ids and all(not e.startswith(last_event.rpartition(".")[0]) for e in reader.event_ids)


async def test_an_answer_given_before_the_stream_is_resumed_is_kept_for_the_replica_that_takes_over(
    make_replica: MakeReplica, modern_upstream: FakeModern, redis: Any
) -> None:
    a, b, _ = await _three(make_replica, modern_upstream, redis)
    async with asyncio.timeout(WAIT):
        peer, request_id, asked_id, last_event = await _asked_on(a, modern_upstream)
        await a.stop()
        assert await on(b, peer).respond(asked_id, ACCEPTED) == 202  # nobody carries the round yet
        resumed = await on(b, peer).get_stream({"Last-Event-ID": last_event})
        final = await SseReader(resumed).message()
    assert final is not None and final["id"] == request_id and "result" in final, final
    assert modern_upstream.calls_of("tools/call")[-1].params["inputResponses"] == {"confirm": ACCEPTED}


async def test_a_round_is_taken_over_once(make_replica: MakeReplica, modern_upstream: FakeModern, redis: Any) -> None:
    a, b, c = await _three(make_replica, modern_upstream, redis)
    async with asyncio.timeout(WAIT):
        peer, request_id, asked_id, last_event = await _asked_on(a, modern_upstream)
        await a.stop()
        first = await on(b, peer).get_stream({"Last-Event-ID": last_event})
        second = await on(c, peer).get_stream({"Last-Event-ID": last_event})
        lost = await SseReader(second).message()  # the round is b's now
        assert await on(c, peer).respond(asked_id, ACCEPTED) == 202
        final = await SseReader(first).message()
    assert lost is not None and lost["error"]["data"]["reason"] == "stream_lost"
    assert final is not None and final["id"] == request_id and "result" in final
    assert len(modern_upstream.calls_of("tools/call")) == 2  # the call went upstream twice: asked, then answered


# ---------------------------------------------------------------------------- HTTP+SSE clients


async def test_an_sse_clients_message_posted_to_another_replica_is_served_where_its_stream_is(
    make_replica: MakeReplica, modern_upstream: FakeModern
) -> None:
    """An HTTP+SSE session is its stream: a POST that lands elsewhere is replayed to the holder,
    and the reply comes on the stream there."""
    store = InMemorySessionStore()
    a = await make_replica(modern_upstream.url, "modern", store=store)
    b = await make_replica(modern_upstream.url, "modern", store=store)
    headers = {"Authorization": "Bearer alice"}
    async with asyncio.timeout(WAIT), legacy_sse_client(a.http, headers, post_via=b.http) as client:
        initialized = await client.initialize()
        assert initialized["result"]["serverInfo"]["name"] == "fake-modern"
        assert (await client.request(1, "ping"))["result"] == {}
        assert b.forwards("sse", "ok") == 3  # initialize, notifications/initialized, ping
        stranger = await client.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"Authorization": "Bearer mallory"})
        assert stranger.status == 404  # another caller cannot use the session, from anywhere
    assert b.forwards("sse", "ok") == 3


async def test_an_sse_clients_message_for_a_replica_that_is_gone_gets_404(
    make_replica: MakeReplica, modern_upstream: FakeModern
) -> None:
    a = await make_replica(modern_upstream.url, "modern")
    b = await make_replica(modern_upstream.url, "modern")
    async with asyncio.timeout(WAIT), legacy_sse_client(a.http, post_via=b.http) as client:
        await a.stop()
        refused = await client.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status == 404
        assert (await refused.json())["error"]["message"] == "Session not found"
    assert b.forwards("sse", "owner_gone") == 1
