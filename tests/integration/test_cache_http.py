"""The response cache through the real proxy app, in front of the scripted fakes.

Spec: 2026-07-28/server/utilities/caching.mdx; policy: docs/translation.md §5.
(a) modern clients, modern upstream; (b) legacy clients, modern upstream; (c) modern clients,
legacy upstream (the proxy authors the hints from `upstream.cache` / `upstream.cache_methods`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.app import CACHE, LEGACY_TO_MODERN, METRICS, MODERN_TO_LEGACY, create_app
from proxy.config import load_settings
from proxy.protocol import jsonrpc, meta
from proxy.state.cache import ResponseCache
from tests.integration.conftest import MakeProxy, Proxy, serve
from tests.support.fake_legacy import PATH as LEGACY_PATH
from tests.support.fake_legacy import FakeLegacy
from tests.support.fake_legacy import Session as LegacySession
from tests.support.fake_modern import Call, FakeModern, Outcome, complete, error, input_required
from tests.support.mcp_client import McpReply, SseReader
from tests.support.modern_client import ModernClient

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}
CAROL = {"Authorization": "Bearer carol"}
ECHO: JSONDict = {"name": "echo", "description": "Echo the input.", "inputSchema": {"type": "object"}}
ADDED: JSONDict = {"name": "added_later", "inputSchema": {"type": "object"}}
DOC = "file:///docs/readme.md"
ELICIT: JSONDict = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Show the document?",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    },
}
ACCEPTED: JSONDict = {"action": "accept", "content": {"ok": True}}


# ---------------------------------------------------------------------------- helpers


def caches_of(proxy: Proxy) -> list[ResponseCache]:
    """Every distinct response cache the app and its relays hold: there must be exactly one, shared
    (app.py). Tests that spy on the cache spy on every instance found, so that they keep testing their
    own behaviour even if the relays stopped sharing one (test_every_relay_uses_the_one_shared_cache)."""
    found = [proxy.app[CACHE], proxy.app[LEGACY_TO_MODERN].backend._cache, proxy.app[MODERN_TO_LEGACY]._cache]
    unique: list[ResponseCache] = []
    for cache in found:
        if not any(cache is seen for seen in unique):
            unique.append(cache)
    return unique


def count(proxy: Proxy, result: str, scope: str) -> float:
    value = proxy.app[METRICS].registry.get_sample_value(
        "mcp_era_proxy_cache_requests_total", {"result": result, "scope": scope}
    )
    return value or 0.0


class Invalidations:
    """Records what each change notification dropped from the cache (spying on the real method, which
    every notification path calls: the watcher's listen or GET stream, pooled sessions, client listens)."""

    def __init__(self, proxy: Proxy) -> None:
        self.seen: asyncio.Queue[tuple[Any, int]] = asyncio.Queue()
        for cache in caches_of(proxy):
            cache.invalidate_for = self._spy(cache.invalidate_for)  # type: ignore[method-assign]

    def _spy(self, original: Any) -> Any:
        def spy(note: JSONDict) -> int:
            dropped = original(note)
            self.seen.put_nowait((note.get("method"), dropped))
            return dropped

        return spy

    async def wait(self, method: str) -> int:
        """How many entries the next `method` notification dropped."""
        async with asyncio.timeout(WAIT):
            while True:
                seen, dropped = await self.seen.get()
                if seen == method:
                    return dropped


def tools_listing(fake: FakeModern, *, ttl: int = 60_000, scope: str = "public", gate: asyncio.Event | None = None):
    """A tools/list handler answering `fake.tools` with cache hints (after `gate`, when given)."""

    async def handler(call: Call) -> Outcome:
        if gate is not None:
            await gate.wait()
        return complete(tools=copy.deepcopy(fake.tools), ttlMs=ttl, cacheScope=scope)

    return handler


def scripted(*outcomes: Outcome) -> Any:
    remaining = list(outcomes)

    async def handler(call: Call) -> Outcome:
        assert remaining, f"unexpected extra {call.method} request"
        return copy.deepcopy(remaining.pop(0))

    return handler


def document(text: str) -> JSONDict:
    return complete(
        contents=[{"uri": DOC, "mimeType": "text/markdown", "text": text}], ttlMs=60_000, cacheScope="public"
    )


def names(result: JSONDict) -> list[str]:
    return [tool["name"] for tool in result["tools"]]


def modern(proxy: Proxy, headers: dict[str, str] | None = None, **kwargs: Any) -> ModernClient:
    return ModernClient(proxy.client, headers=headers, **kwargs)


async def requests(peer: ModernClient, method: str, params: JSONDict | None = None, times: int = 1) -> list[McpReply]:
    async with asyncio.timeout(WAIT):
        return [await peer.request(method, params) for _ in range(times)]


# ---------------------------------------------------------------------------- one cache per app


async def test_every_relay_uses_the_one_shared_cache(make_proxy: MakeProxy) -> None:
    """app.py builds one ResponseCache (its on_store starts the watcher, an era change clears it) and
    hands it to every relay; a relay building its own would neither share entries across eras nor be
    watched nor cleared."""
    proxy = await make_proxy()
    assert len(caches_of(proxy)) == 1


# ---------------------------------------------------------------------------- (a) modern clients, modern upstream


async def test_a_repeated_tools_list_is_served_from_memory_with_the_remaining_ttl(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.tools = [ECHO]
    fake.handlers["tools/list"] = tools_listing(fake)
    proxy = await make_proxy()
    first, second, third = await requests(modern(proxy, ALICE), "tools/list", times=3)
    assert len(fake.calls_of("tools/list")) == 1
    assert first.result == {"resultType": "complete", "tools": [ECHO], "ttlMs": 60_000, "cacheScope": "public"}
    # A hit carries what is left of the freshness, never the original hint (docs/translation.md §5 Freshness).
    assert 50_000 < second.result["ttlMs"] < 60_000
    assert third.result["ttlMs"] <= second.result["ttlMs"]
    assert {**second.result, "ttlMs": None} == {**first.result, "ttlMs": None}
    # (No method label on the cache metrics: the watcher's own server/discover may count a miss too.)
    assert count(proxy, "hit", "public") == 2


async def test_two_authorization_contexts_share_a_public_entry_once_the_upstream_served_each(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.tools = [ECHO]
    fake.handlers["tools/list"] = tools_listing(fake)
    proxy = await make_proxy()
    alice, bob, carol = modern(proxy, ALICE), modern(proxy, BOB), modern(proxy, CAROL)
    await requests(alice, "tools/list")
    await requests(bob, "tools/list")  # never served by the upstream yet: it must ask the upstream itself
    assert [c.headers.get("Authorization") for c in fake.calls_of("tools/list")] == ["Bearer alice", "Bearer bob"]
    [alice_again] = await requests(alice, "tools/list")
    [bob_again] = await requests(bob, "tools/list")
    assert len(fake.calls_of("tools/list")) == 2  # both served from the one public entry
    assert names(alice_again.result) == names(bob_again.result) == ["echo"]
    await requests(carol, "tools/list")  # a third context is not served from memory before the upstream vouched
    assert [c.headers.get("Authorization") for c in fake.calls_of("tools/list")][2:] == ["Bearer carol"]


async def test_private_entries_are_fetched_and_kept_per_authorization_context(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    async def per_caller(call: Call) -> Outcome:
        owner = call.headers.get("Authorization", "anonymous").split()[-1]
        return complete(
            tools=[{"name": f"{owner}_tool", "inputSchema": {"type": "object"}}], ttlMs=60_000, cacheScope="private"
        )

    fake.handlers["tools/list"] = per_caller
    proxy = await make_proxy()
    alice_replies = await requests(modern(proxy, ALICE), "tools/list", times=2)
    bob_replies = await requests(modern(proxy, BOB), "tools/list", times=2)
    anonymous_replies = await requests(modern(proxy), "tools/list", times=1)
    assert [names(r.result) for r in alice_replies] == [["alice_tool"]] * 2
    assert [names(r.result) for r in bob_replies] == [["bob_tool"]] * 2
    assert names(anonymous_replies[0].result) == ["anonymous_tool"]
    assert [c.headers.get("Authorization") for c in fake.calls_of("tools/list")] == [
        "Bearer alice",
        "Bearer bob",
        None,
    ]
    assert all(r.result["cacheScope"] == "private" for r in alice_replies + bob_replies)


async def test_the_proxys_own_listen_receives_list_changed_and_the_next_tools_list_goes_upstream(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.tools = [ECHO]
    fake.handlers["tools/list"] = tools_listing(fake)
    proxy = await make_proxy(**{"cache.watch": True})
    invalidations = Invalidations(proxy)
    alice = modern(proxy, ALICE)
    await requests(alice, "tools/list")
    try:
        async with asyncio.timeout(WAIT):
            listen = await fake.wait_listen()  # no client listens: this one is the proxy's (CacheWatcher)
    except TimeoutError:
        pytest.fail("the proxy opened no subscriptions/listen of its own after caching tools/list")
    assert listen.filter.get("toolsListChanged") is True
    assert "Authorization" not in listen.call.headers
    await requests(alice, "tools/list")
    assert len(fake.calls_of("tools/list")) == 1  # still fresh
    fake.tools = [ECHO, ADDED]
    listen.push("notifications/tools/list_changed")
    assert await invalidations.wait("notifications/tools/list_changed") == 1
    [after] = await requests(alice, "tools/list")
    assert len(fake.calls_of("tools/list")) == 2
    assert names(after.result) == ["echo", "added_later"]
    assert after.result["ttlMs"] == 60_000  # a fresh answer, not a leftover
    assert len(fake.calls_of("subscriptions/listen")) == 1


async def test_concurrent_identical_tools_list_requests_make_one_upstream_call(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    clients = 5
    gate = asyncio.Event()
    fake.tools = [ECHO]
    fake.handlers["tools/list"] = tools_listing(fake, gate=gate)
    proxy = await make_proxy()
    entered, all_in = 0, asyncio.Event()

    def counting(original: Any) -> Any:
        async def fetch(key: tuple[Any, ...], principal: str, load: Any) -> JSONDict:
            # Everything up to waiting on the first caller's load runs before this yields control.
            nonlocal entered
            if key[0] == "tools/list":
                entered += 1
                if entered == clients:
                    all_in.set()
            return await original(key, principal, load)

        return fetch

    for cache in caches_of(proxy):
        cache.fetch = counting(cache.fetch)  # type: ignore[method-assign]
    alice = modern(proxy, ALICE)
    async with asyncio.timeout(WAIT):
        pending = [asyncio.create_task(alice.request("tools/list")) for _ in range(clients)]
        await fake.next_call("tools/list")
        await all_in.wait()
        gate.set()
        replies = await asyncio.gather(*pending)
    assert len(fake.calls_of("tools/list")) == 1
    assert [names(r.result) for r in replies] == [["echo"]] * clients
    assert sorted(r.final["id"] for r in replies if r.final) == sorted(r.request_id for r in replies)
    assert count(proxy, "shared", "public") == clients - 1


async def test_tools_call_is_never_cached(make_proxy: MakeProxy, fake: FakeModern) -> None:
    fake.handlers["tools/call"] = scripted(
        complete(content=[{"type": "text", "text": "one"}], ttlMs=60_000, cacheScope="public"),
        complete(content=[{"type": "text", "text": "two"}], ttlMs=60_000, cacheScope="public"),
    )
    proxy = await make_proxy()
    replies = await requests(modern(proxy, ALICE), "tools/call", {"name": "echo", "arguments": {}}, times=2)
    assert [r.result["content"][0]["text"] for r in replies] == ["one", "two"]
    assert len(fake.calls_of("tools/call")) == 2


async def test_requests_carrying_input_responses_or_request_state_are_neither_served_from_nor_stored_in_the_cache(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.handlers["resources/read"] = scripted(document("retry-1"), document("retry-2"), document("plain"))
    proxy = await make_proxy()
    alice = modern(proxy, ALICE)
    retry = {"uri": DOC, "inputResponses": {"confirm": ACCEPTED}, "requestState": "state-1"}
    first, second = await requests(alice, "resources/read", retry, times=2)
    assert [first.result["contents"][0]["text"], second.result["contents"][0]["text"]] == ["retry-1", "retry-2"]
    plain, plain_again = await requests(alice, "resources/read", {"uri": DOC}, times=2)
    assert plain.result["contents"][0]["text"] == "plain"  # not the stored result of a retry
    assert plain_again.result["contents"][0]["text"] == "plain"
    calls = fake.calls_of("resources/read")
    assert len(calls) == 3
    assert [("requestState" in c.params) for c in calls] == [True, True, False]


async def test_error_replies_and_input_required_results_are_never_cached(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.tools = [ECHO]
    listing = complete(tools=[ECHO], ttlMs=60_000, cacheScope="public")
    fake.handlers["tools/list"] = scripted(error(jsonrpc.INTERNAL_ERROR, "temporarily broken"), listing)
    fake.handlers["resources/read"] = scripted(input_required({"confirm": ELICIT}, "state-1"), document("read"))
    proxy = await make_proxy()
    alice = modern(proxy, ALICE)
    broken, listed, cached = await requests(alice, "tools/list", times=3)
    assert broken.error["message"] == "temporarily broken"
    assert names(listed.result) == names(cached.result) == ["echo"]
    assert len(fake.calls_of("tools/list")) == 2
    asked, read = await requests(alice, "resources/read", {"uri": DOC}, times=2)
    assert asked.result["resultType"] == "input_required"
    assert read.result["contents"][0]["text"] == "read"
    assert len(fake.calls_of("resources/read")) == 2


async def test_cache_enabled_false_sends_every_request_upstream(make_proxy: MakeProxy, fake: FakeModern) -> None:
    fake.tools = [ECHO]
    fake.handlers["tools/list"] = tools_listing(fake)
    proxy = await make_proxy(**{"cache.enabled": False})
    replies = await requests(modern(proxy, ALICE), "tools/list", times=3)
    assert len(fake.calls_of("tools/list")) == 3
    assert [r.result["ttlMs"] for r in replies] == [60_000] * 3
    assert count(proxy, "hit", "public") == 0


# ---------------------------------------------------------------------------- (b) legacy clients, modern upstream


async def test_a_legacy_session_and_a_modern_client_share_one_tools_list_entry_each_in_its_own_shape(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    fake.tools = [ECHO]
    fake.handlers["tools/list"] = tools_listing(fake)
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(headers=ALICE)
        legacy_first = await peer.request("tools/list")
        [upstream] = fake.calls_of("tools/list")
        # A modern client declaring what the legacy session's capabilities mean upstream asks the same.
        same = modern(proxy, ALICE, capabilities=upstream.meta[meta.CLIENT_CAPABILITIES])
        modern_reply = await same.request("tools/list")
        other_peer = await proxy.connect(headers=ALICE)
        legacy_second = await other_peer.request("tools/list")
    assert len(fake.calls_of("tools/list")) == 1
    for reply in (legacy_first, legacy_second):
        # No resultType, ttlMs, cacheScope or _meta for legacy; a 2025-11-25 session is told any
        # tool may run as a task the proxy hosts (docs/use/tasks.md).
        assert reply.result == {"tools": [{**ECHO, "execution": {"taskSupport": "optional"}}]}
    assert modern_reply.result["resultType"] == "complete"
    assert modern_reply.result["cacheScope"] == "public"
    assert modern_reply.result["tools"] == [ECHO]
    assert 0 < modern_reply.result["ttlMs"] < 60_000


async def test_initialize_is_answered_from_the_cached_server_discover(make_proxy: MakeProxy, fake: FakeModern) -> None:
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        peers = [await proxy.connect() for _ in range(3)]
    assert len(fake.calls_of("server/discover")) == 1
    first = peers[0].initialize_result
    assert all(p.initialize_result == first for p in peers[1:])
    assert first["instructions"] == fake.discover["instructions"]


async def test_a_legacy_clients_result_completed_through_input_rounds_is_not_cached(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """The final result of an upstream retry carrying inputResponses/requestState MUST NOT be cached
    (caching.mdx §Cache Key; docs/translation.md §5 "Never cache MRTR")."""
    fake.handlers["resources/read"] = scripted(
        input_required({"confirm": ELICIT}, "state-1"), document("after-input"), document("asked-again")
    )
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        request_id, response = await peer.send("resources/read", {"uri": DOC})
        reader = SseReader(response)
        while True:
            message = await reader.message()
            assert message is not None, "the stream ended without a response"
            if "method" not in message:
                break
            assert message["method"] == "elicitation/create", message
            assert await peer.respond(message["id"], ACCEPTED) == 202
        assert message.get("id") == request_id and message["result"]["contents"][0]["text"] == "after-input"
        again = await peer.request("resources/read", {"uri": DOC})
    calls = fake.calls_of("resources/read")
    assert [("requestState" in c.params) for c in calls[:2]] == [False, True]
    assert len(calls) == 3, "the second read was served from a result obtained with inputResponses"
    assert again.result["contents"][0]["text"] == "asked-again"


# ---------------------------------------------------------------------------- (c) modern clients, legacy upstream


@pytest.fixture
async def legacy_fake(aiohttp_server: Any) -> AsyncIterator[FakeLegacy]:
    fake = FakeLegacy()
    server = await serve(aiohttp_server, fake.app)
    fake.url = str(server.make_url(LEGACY_PATH))
    yield fake
    problems = fake.protocol_problems()
    assert not problems, f"the proxy sent what a 2025-11-25 server must refuse: {problems}"


@pytest.fixture
def make_legacy_proxy(aiohttp_server: Any, aiohttp_client: Any, legacy_fake: FakeLegacy) -> MakeProxy:
    async def build(**overrides: Any) -> Proxy:
        settings = load_settings(
            None,
            **{"upstream.url": legacy_fake.url, "upstream.name": "fake-legacy", "upstream.era": "legacy", **overrides},
        )
        app, admin = create_app(settings)
        assert admin is None
        server = await serve(aiohttp_server, app)
        return Proxy(app, await aiohttp_client(server), settings)

    return build


CACHE_TOOLS_LIST = {"upstream.cache_methods": {"tools/list": {"ttl_ms": 60_000, "scope": "public"}}}


async def watch_session(fake: FakeLegacy) -> LegacySession:
    """The proxy's own watch session: the one initialized without client capabilities (pooled sessions
    declare every input capability), once its GET stream is open."""
    try:
        async with asyncio.timeout(WAIT):
            while True:
                call = await fake.next_call("initialize")
                if call.session is not None and call.session.capabilities == {}:
                    await call.session.stream()
                    return call.session
    except TimeoutError:
        pytest.fail("the proxy opened no upstream session of its own after caching tools/list")


async def test_by_default_nothing_from_a_legacy_upstream_is_cached(
    make_legacy_proxy: MakeProxy, legacy_fake: FakeLegacy
) -> None:
    legacy_fake.tools = [ECHO]
    proxy = await make_legacy_proxy()
    replies = await requests(modern(proxy, ALICE), "tools/list", times=2)
    assert len(legacy_fake.calls_of("tools/list")) == 2
    assert [(r.result["ttlMs"], r.result["cacheScope"]) for r in replies] == [(0, "private")] * 2


async def test_with_cache_methods_the_second_tools_list_never_reaches_the_legacy_upstream(
    make_legacy_proxy: MakeProxy, legacy_fake: FakeLegacy
) -> None:
    legacy_fake.tools = [ECHO]
    proxy = await make_legacy_proxy(**CACHE_TOOLS_LIST)
    first, second = await requests(modern(proxy, ALICE), "tools/list", times=2)
    assert len(legacy_fake.calls_of("tools/list")) == 1
    assert (first.result["ttlMs"], first.result["cacheScope"]) == (60_000, "public")
    assert 0 < second.result["ttlMs"] < 60_000
    assert names(first.result) == names(second.result) == ["echo"]


async def test_list_changed_on_the_watch_sessions_get_stream_empties_the_legacy_tools_list_entry(
    make_legacy_proxy: MakeProxy, legacy_fake: FakeLegacy
) -> None:
    legacy_fake.tools = [ECHO]
    proxy = await make_legacy_proxy(**CACHE_TOOLS_LIST, **{"cache.watch": True})
    invalidations = Invalidations(proxy)
    alice = modern(proxy, ALICE)
    await requests(alice, "tools/list")
    watch = await watch_session(legacy_fake)
    assert watch.initialize.headers.get("Authorization") is None  # the proxy's own, not alice's
    legacy_fake.tools = [ECHO, ADDED]
    watch.push("notifications/tools/list_changed")
    assert await invalidations.wait("notifications/tools/list_changed") == 1
    [after] = await requests(alice, "tools/list")
    assert len(legacy_fake.calls_of("tools/list")) == 2
    assert names(after.result) == ["echo", "added_later"]


async def test_list_changed_on_a_pooled_sessions_get_stream_empties_the_legacy_tools_list_entry(
    make_legacy_proxy: MakeProxy, legacy_fake: FakeLegacy
) -> None:
    legacy_fake.tools = [ECHO]
    proxy = await make_legacy_proxy(**CACHE_TOOLS_LIST)
    invalidations = Invalidations(proxy)
    alice = modern(proxy, ALICE)
    await requests(alice, "tools/list")
    pooled = legacy_fake.calls_of("tools/list")[0].session
    assert pooled is not None
    async with asyncio.timeout(WAIT):
        await pooled.stream()
    legacy_fake.tools = [ECHO, ADDED]
    pooled.push("notifications/tools/list_changed")
    assert await invalidations.wait("notifications/tools/list_changed") == 1
    [after] = await requests(alice, "tools/list")
    assert len(legacy_fake.calls_of("tools/list")) == 2
    assert names(after.result) == ["echo", "added_later"]
