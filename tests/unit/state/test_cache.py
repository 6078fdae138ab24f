"""The response cache on its own: no sockets, a fresh Metrics registry and a clock the test moves.

Spec: 2026-07-28/server/utilities/caching.mdx; policy: docs/translation.md §5.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from proxy.config import CacheConfig
from proxy.metrics import Metrics
from proxy.protocol import jsonrpc
from proxy.protocol.outcome import Outcome
from proxy.protocol.versions import LATEST_MODERN
from proxy.state.cache import ResponseCache, request_key
from proxy.state.sessions import principal_of

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for
CAPS: JSONDict = {"sampling": {}, "elicitation": {"form": {}}}
TOOLS_KEY = request_key("tools/list", {}, LATEST_MODERN, CAPS)
ANONYMOUS = ""
ALICE = principal_of("Bearer alice")
BOB = principal_of("Bearer bob")
CAROL = principal_of("Bearer carol")


def _key(method: str, **params: Any) -> tuple[Any, ...]:
    return request_key(method, params, LATEST_MODERN, CAPS)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(**config: Any) -> tuple[ResponseCache, Metrics, Clock]:
    metrics, clock = Metrics(), Clock()
    return ResponseCache(CacheConfig(**config), metrics, clock), metrics, clock


def listing(
    *names: str, ttl: Any = 60_000, scope: Any = "public", omit: tuple[str, ...] = (), request_id: Any = 7
) -> JSONDict:
    """A complete tools/list reply as an upstream sends it (fields in `omit` left out)."""
    result: JSONDict = {
        "resultType": "complete",
        "tools": [{"name": name, "inputSchema": {"type": "object"}} for name in names or ("echo",)],
        "ttlMs": ttl,
        "cacheScope": scope,
    }
    for name in omit:
        result.pop(name)
    return jsonrpc.result_response(request_id, result)


def input_required_reply(**hints: Any) -> JSONDict:
    return jsonrpc.result_response(
        7,
        {
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {}}},
            "requestState": "state-1",
            **hints,
        },
    )


class Loader:
    """A load function that answers `replies` in turn (the last one forever) and counts its calls.

    With a `gate`, each call waits for it first; `started` is set when the first call begins.
    """

    def __init__(self, *replies: JSONDict | Outcome | BaseException, gate: asyncio.Event | None = None) -> None:
        self.replies = list(replies)
        self.calls = 0
        self.gate = gate
        self.started = asyncio.Event()

    async def __call__(self) -> Outcome:
        self.calls += 1
        self.started.set()
        reply = self.replies[min(self.calls, len(self.replies)) - 1]
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Outcome):
            return Outcome(copy.deepcopy(reply.message), reply.status, reply.shareable)
        return Outcome(copy.deepcopy(reply))


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value("mcp_era_proxy_" + name, labels or None)
    return value or 0.0


def requests_counted(metrics: Metrics) -> dict[tuple[str, str], float]:
    counts = {}
    for result in ("hit", "miss", "shared"):
        for scope in ("public", "private", "none"):
            value = sample(metrics, "cache_requests_total", result=result, scope=scope)
            if value:
                counts[(result, scope)] = value
    return counts


async def concurrently(*calls: Callable[[], Awaitable[Outcome]], release: asyncio.Event) -> list[Any]:
    """Start `calls` in order (asyncio runs new tasks first-in first-out, so each reaches its first
    suspension before the next starts), then open `release`; return every outcome (or exception)."""

    async def open_gate() -> None:
        release.set()

    async with asyncio.timeout(WAIT):
        outcomes = await asyncio.gather(*(call() for call in calls), open_gate(), return_exceptions=True)
    return outcomes[:-1]


# ---------------------------------------------------------------------------- freshness


async def test_a_hit_is_served_with_the_ttl_remaining_since_receipt() -> None:
    cache, _, clock = make()
    load = Loader(listing("echo", ttl=60_000))
    first = await cache.fetch(TOOLS_KEY, ALICE, load)
    clock.advance(15.0)
    second = await cache.fetch(TOOLS_KEY, ALICE, load)
    assert load.calls == 1
    assert first.message["result"]["ttlMs"] == 60_000  # the miss passes the upstream's own hint on
    assert second.message["result"] == {**first.message["result"], "ttlMs": 45_000}


async def test_freshness_counts_from_when_the_result_was_received_not_when_it_was_asked() -> None:
    cache, _, clock = make()

    async def slow_upstream() -> Outcome:
        clock.advance(10.0)  # the upstream takes 10 s to answer
        return Outcome(listing(ttl=60_000))

    await cache.fetch(TOOLS_KEY, ALICE, slow_upstream)
    clock.advance(55.0)  # 65 s after the request, 55 s after the answer: still fresh
    hit = cache.lookup(TOOLS_KEY, ALICE)
    assert hit is not None
    assert hit["ttlMs"] == 5_000


async def test_an_entry_is_stale_once_its_ttl_has_passed_and_is_fetched_again() -> None:
    cache, metrics, clock = make()
    load = Loader(listing("old"), listing("new"))
    await cache.fetch(TOOLS_KEY, ALICE, load)
    clock.advance(59.999)
    assert cache.lookup(TOOLS_KEY, ALICE) is not None
    clock.advance(0.001)  # now == received + ttlMs: no longer fresh (fresh while now < t + ttl)
    assert cache.lookup(TOOLS_KEY, ALICE) is None
    again = await cache.fetch(TOOLS_KEY, ALICE, load)
    assert load.calls == 2
    assert [tool["name"] for tool in again.message["result"]["tools"]] == ["new"]
    assert sample(metrics, "cache_evictions_total", reason="expired", scope="public") == 1


async def test_max_ttl_ms_caps_how_long_any_result_stays_fresh() -> None:
    cache, _, clock = make(max_ttl_ms=1_000)
    load = Loader(listing(ttl=60_000))
    await cache.fetch(TOOLS_KEY, ALICE, load)
    clock.advance(0.25)
    hit = cache.lookup(TOOLS_KEY, ALICE)
    assert hit is not None and hit["ttlMs"] == 750
    clock.advance(0.75)
    assert cache.lookup(TOOLS_KEY, ALICE) is None


async def test_max_ttl_ms_zero_caches_nothing() -> None:
    cache, _, _ = make(max_ttl_ms=0)
    load = Loader(listing(ttl=60_000))
    await cache.fetch(TOOLS_KEY, ALICE, load)
    await cache.fetch(TOOLS_KEY, ALICE, load)
    assert not cache.enabled
    assert load.calls == 2 and len(cache) == 0


async def test_enabled_false_caches_nothing() -> None:
    cache, _, _ = make(enabled=False)
    load = Loader(listing(ttl=60_000))
    await cache.fetch(TOOLS_KEY, ALICE, load)
    await cache.fetch(TOOLS_KEY, ALICE, load)
    assert load.calls == 2 and len(cache) == 0


# ---------------------------------------------------------------------------- scope


async def test_a_public_entry_is_served_to_another_principal_only_once_the_upstream_served_that_principal() -> None:
    cache, _, _ = make()
    load = Loader(listing("for-alice"), listing("for-bob"))
    await cache.fetch(TOOLS_KEY, ALICE, load)
    assert cache.lookup(TOOLS_KEY, BOB) is None  # the upstream never vouched for bob
    bobs = await cache.fetch(TOOLS_KEY, BOB, load)  # so bob's request goes upstream
    assert load.calls == 2
    assert bobs.message["result"]["tools"][0]["name"] == "for-bob"
    # Now both were served by the upstream: the one public entry serves both, and nobody else.
    alice_hit, bob_hit = cache.lookup(TOOLS_KEY, ALICE), cache.lookup(TOOLS_KEY, BOB)
    assert alice_hit is not None and bob_hit is not None
    assert alice_hit["tools"] == bob_hit["tools"]
    assert cache.lookup(TOOLS_KEY, CAROL) is None
    assert len(cache) == 1


async def test_a_public_entry_fetched_anonymously_is_served_to_every_principal() -> None:
    cache, _, _ = make()
    load = Loader(listing("open"))
    await cache.fetch(TOOLS_KEY, ANONYMOUS, load)
    for principal in (ALICE, BOB, ANONYMOUS):
        hit = cache.lookup(TOOLS_KEY, principal)
        assert hit is not None and hit["tools"][0]["name"] == "open"
    assert load.calls == 1


async def test_a_private_entry_is_never_served_to_another_principal() -> None:
    cache, _, _ = make()
    load = Loader(listing("alice-only", scope="private"), listing("bob-only", scope="private"))
    await cache.fetch(TOOLS_KEY, ALICE, load)
    await cache.fetch(TOOLS_KEY, BOB, load)  # bob was served by the upstream: vouched, yet still not shared
    assert load.calls == 2
    alice_hit, bob_hit = cache.lookup(TOOLS_KEY, ALICE), cache.lookup(TOOLS_KEY, BOB)
    assert alice_hit is not None and alice_hit["tools"][0]["name"] == "alice-only"
    assert bob_hit is not None and bob_hit["tools"][0]["name"] == "bob-only"
    assert cache.lookup(TOOLS_KEY, CAROL) is None
    assert cache.lookup(TOOLS_KEY, ANONYMOUS) is None


async def test_the_anonymous_principals_private_entries_are_not_served_to_authenticated_callers() -> None:
    cache, _, _ = make()
    await cache.fetch(TOOLS_KEY, ANONYMOUS, Loader(listing("anonymous-view", scope="private")))
    assert cache.lookup(TOOLS_KEY, ALICE) is None
    # Not even to a caller the upstream vouched for (by serving it something else).
    await cache.fetch(_key("prompts/list"), ALICE, Loader(listing()))
    assert cache.lookup(TOOLS_KEY, ALICE) is None
    alices = await cache.fetch(TOOLS_KEY, ALICE, Loader(listing("alice-view", scope="private")))
    assert alices.message["result"]["tools"][0]["name"] == "alice-view"


# ---------------------------------------------------------------------------- what is never stored


def _never_stored_cases() -> list[Any]:
    bad_reply = jsonrpc.error_response(7, jsonrpc.INTERNAL_ERROR, "boom")
    return [
        pytest.param(bad_reply, {}, id="error-reply"),
        pytest.param(input_required_reply(), {}, id="input-required"),
        pytest.param(input_required_reply(ttlMs=60_000, cacheScope="public"), {}, id="input-required-with-hints"),
        pytest.param(listing(ttl=0), {}, id="ttl-zero"),
        pytest.param(listing(omit=("ttlMs",)), {}, id="ttl-absent"),
        pytest.param(listing(ttl=-5_000), {}, id="ttl-negative"),
        pytest.param(listing(ttl=1.5), {}, id="ttl-float"),
        pytest.param(listing(ttl="60000"), {}, id="ttl-string"),
        pytest.param(listing(ttl=True), {}, id="ttl-boolean"),
        pytest.param(listing(omit=("cacheScope",)), {}, id="scope-absent"),
        pytest.param(listing(scope="shared"), {}, id="scope-unknown"),
        pytest.param(listing(scope=None), {}, id="scope-null"),
        pytest.param(listing(*(f"tool-{n}" for n in range(40))), {"max_bytes": 512}, id="bigger-than-max-bytes"),
    ]


@pytest.mark.parametrize(("reply", "config"), _never_stored_cases())
async def test_results_the_spec_does_not_let_a_cache_keep_are_never_stored(reply: JSONDict, config: JSONDict) -> None:
    cache, metrics, _ = make(**config)
    load = Loader(reply)
    first = await cache.fetch(TOOLS_KEY, ANONYMOUS, load)
    second = await cache.fetch(TOOLS_KEY, ANONYMOUS, load)
    assert first.message == second.message == reply  # passed through unchanged
    assert load.calls == 2
    assert len(cache) == 0
    assert sample(metrics, "cache_entries") == 0 and sample(metrics, "cache_bytes") == 0


async def test_a_result_exactly_max_bytes_long_is_kept() -> None:
    reply = listing("fits")
    size = len(orjson.dumps(reply["result"]))
    cache, metrics, _ = make(max_bytes=size)
    load = Loader(reply)
    await cache.fetch(TOOLS_KEY, ANONYMOUS, load)
    await cache.fetch(TOOLS_KEY, ANONYMOUS, load)
    assert load.calls == 1
    assert sample(metrics, "cache_bytes") == size


# ---------------------------------------------------------------------------- the key


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(request_key("prompts/list", {}, LATEST_MODERN, CAPS), id="method"),
        pytest.param(request_key("tools/list", {"cursor": "page-2"}, LATEST_MODERN, CAPS), id="cursor"),
        pytest.param(request_key("tools/list", {}, "2099-01-01", CAPS), id="protocol-version"),
        pytest.param(request_key("tools/list", {}, LATEST_MODERN, {"sampling": {}}), id="capabilities"),
        pytest.param(request_key("tools/list", {}, LATEST_MODERN, None), id="capabilities-left-out"),
    ],
)
async def test_a_request_differing_in_method_params_version_or_capabilities_is_not_served_the_entry(
    other: tuple[Any, ...],
) -> None:
    cache, _, _ = make()
    await cache.fetch(TOOLS_KEY, ALICE, Loader(listing()))
    assert other != TOOLS_KEY
    assert cache.lookup(other, ALICE) is None


async def test_meta_such_as_progress_token_and_trace_context_is_not_part_of_the_key() -> None:
    cache, _, _ = make()
    key = request_key(
        "resources/read", {"uri": "file:///a", "_meta": {"progressToken": "p-1"}}, LATEST_MODERN, {"roots": {}}
    )
    same = request_key(
        "resources/read",
        {"_meta": {"progressToken": "p-2", "traceparent": "00-abc-def-01", "tracestate": "x=1"}, "uri": "file:///a"},
        LATEST_MODERN,
        {"roots": {}},
    )
    other_uri = request_key("resources/read", {"uri": "file:///b"}, LATEST_MODERN, {"roots": {}})
    assert key == same
    assert key != other_uri
    await cache.fetch(key, ALICE, Loader(listing()))
    assert cache.lookup(same, ALICE) is not None
    assert cache.lookup(other_uri, ALICE) is None


def test_the_key_does_not_depend_on_the_order_of_params_or_capabilities() -> None:
    one = request_key("tools/list", {"cursor": "c", "x": 1}, LATEST_MODERN, {"a": {}, "b": {"c": 1, "d": 2}})
    two = request_key("tools/list", {"x": 1, "cursor": "c"}, LATEST_MODERN, {"b": {"d": 2, "c": 1}, "a": {}})
    assert one == two


LONG = 123456789012345678901234567890  # beyond 64 bits: orjson cannot write it


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"uri": "file:///a", "n": LONG}, id="integer-beyond-64-bits"),
        pytest.param({"uri": "file:///a", "deep": json.loads("[" * 300 + "]" * 300)}, id="nested-beyond-254"),
    ],
)
async def test_a_key_is_made_and_served_for_params_orjson_cannot_write(params: JSONDict) -> None:
    """Valid JSON all the same: the key falls back to the exact codec, never fails (docs/translation.md §5 Key)."""
    cache, _, _ = make()
    key = request_key("resources/read", params, LATEST_MODERN, {"x-vendor": {"n": LONG}})
    reordered = dict(reversed(list(params.items())))
    assert key == request_key("resources/read", reordered, LATEST_MODERN, {"x-vendor": {"n": LONG}})
    reply = {"jsonrpc": "2.0", "id": 1, "result": {"contents": [], "n": LONG, "ttlMs": 60_000, "cacheScope": "public"}}
    await cache.fetch(key, ALICE, Loader(reply))
    hit = cache.lookup(key, ALICE)
    assert hit is not None and hit["n"] == LONG
    assert cache.watched_uris() == ["file:///a"]


# ---------------------------------------------------------------------------- memory bounds


async def test_the_least_recently_used_entry_goes_first_when_entries_are_bounded() -> None:
    cache, metrics, _ = make(max_entries=2)
    keys = [request_key("resources/read", {"uri": f"file:///{n}"}, LATEST_MODERN, None) for n in "abc"]
    load = Loader(listing())
    await cache.fetch(keys[0], ALICE, load)
    await cache.fetch(keys[1], ALICE, load)
    assert cache.lookup(keys[0], ALICE) is not None  # a hit makes `a` the most recently used
    await cache.fetch(keys[2], ALICE, load)
    assert len(cache) == 2
    assert cache.lookup(keys[1], ALICE) is None  # `b` was used least recently
    assert cache.lookup(keys[0], ALICE) is not None and cache.lookup(keys[2], ALICE) is not None
    assert sample(metrics, "cache_evictions_total", reason="lru", scope="public") == 1
    assert sample(metrics, "cache_entries") == 2


async def test_the_least_recently_used_entries_go_first_when_bytes_are_bounded() -> None:
    keys = [request_key("resources/read", {"uri": f"file:///{n}"}, LATEST_MODERN, None) for n in "abc"]
    reply = listing("same-size")
    size = len(orjson.dumps(reply["result"]))
    cache, metrics, _ = make(max_bytes=2 * size + size // 2)  # room for two, not three
    load = Loader(reply)
    await cache.fetch(keys[0], ALICE, load)
    await cache.fetch(keys[1], ALICE, load)
    assert cache.lookup(keys[0], ALICE) is not None
    await cache.fetch(keys[2], ALICE, load)
    assert cache.lookup(keys[1], ALICE) is None
    assert cache.lookup(keys[0], ALICE) is not None and cache.lookup(keys[2], ALICE) is not None
    assert sample(metrics, "cache_bytes") == 2 * size
    assert sample(metrics, "cache_evictions_total", reason="lru", scope="public") == 1


# ---------------------------------------------------------------------------- invalidation


ALL_KEYS = {
    "tools": _key("tools/list"),
    "tools-page-2": _key("tools/list", cursor="2"),
    "prompts": _key("prompts/list"),
    "resources": _key("resources/list"),
    "templates": _key("resources/templates/list"),
    "discover": _key("server/discover"),
    "dir": _key("resources/read", uri="file:///dir"),
    "dir-child": _key("resources/read", uri="file:///dir/a.txt"),
    "dir-grandchild": _key("resources/read", uri="file:///dir/sub/b.txt"),
    "dir-sibling": _key("resources/read", uri="file:///directory"),
    "other": _key("resources/read", uri="file:///other"),
}


async def _filled() -> ResponseCache:
    cache, _, _ = make()
    for key in ALL_KEYS.values():
        # Bob first: once alice's public entry exists, a vouched bob would be served it instead.
        await cache.fetch(key, BOB, Loader(listing(scope="private")))
        await cache.fetch(key, ALICE, Loader(listing()))
    assert len(cache) == 2 * len(ALL_KEYS)
    return cache


def _remaining(cache: ResponseCache) -> set[str]:
    return {name for name, key in ALL_KEYS.items() if cache.lookup(key, ALICE) is not None}


@pytest.mark.parametrize(
    ("method", "params", "dropped"),
    [
        ("notifications/tools/list_changed", None, {"tools", "tools-page-2"}),
        ("notifications/prompts/list_changed", None, {"prompts"}),
        ("notifications/resources/list_changed", None, {"resources", "templates"}),
        ("notifications/resources/updated", {"uri": "file:///dir"}, {"dir", "dir-child", "dir-grandchild"}),
        ("notifications/resources/updated", {"uri": "file:///dir/"}, {"dir-child", "dir-grandchild"}),
        ("notifications/resources/updated", {"uri": "file:///dir/a.txt"}, {"dir-child"}),
        ("notifications/resources/updated", {"uri": 42}, set()),
        ("notifications/message", {"level": "info", "data": "x"}, set()),
    ],
)
async def test_a_change_notification_drops_exactly_the_entries_it_makes_stale_in_every_scope(
    method: str, params: JSONDict | None, dropped: set[str]
) -> None:
    cache = await _filled()
    before = len(cache)
    count = cache.invalidate_for(jsonrpc.notification(method, params))
    assert _remaining(cache) == set(ALL_KEYS) - dropped
    # Bob's private entries of the same keys went too (all scopes).
    assert all(cache.lookup(ALL_KEYS[name], BOB) is None for name in dropped)
    assert count == 2 * len(dropped) == before - len(cache)


# ---------------------------------------------------------------------------- metrics


async def test_metrics_count_hits_misses_shares_invalidations_and_gauge_the_size() -> None:
    cache, metrics, _ = make()
    public, private = listing("p"), listing("q", scope="private")
    public_size, private_size = len(orjson.dumps(public["result"])), len(orjson.dumps(private["result"]))
    prompts = _key("prompts/list")
    await cache.fetch(TOOLS_KEY, ALICE, Loader(public))  # miss, public
    await cache.fetch(TOOLS_KEY, ALICE, Loader(public))  # hit, public
    await cache.fetch(prompts, ALICE, Loader(private))  # miss, private
    await cache.fetch(prompts, ALICE, Loader(private))  # hit, private
    await cache.fetch(_key("resources/list"), ALICE, Loader(jsonrpc.error_response(1, -32603, "x")))  # miss, none
    assert requests_counted(metrics) == {
        ("miss", "public"): 1,
        ("hit", "public"): 1,
        ("miss", "private"): 1,
        ("hit", "private"): 1,
        ("miss", "none"): 1,
    }
    assert sample(metrics, "cache_entries") == 2
    assert sample(metrics, "cache_bytes") == public_size + private_size
    cache.invalidate_for(jsonrpc.notification("notifications/prompts/list_changed"))
    assert sample(metrics, "cache_invalidations_total", scope="private", reason="list_changed") == 1
    assert sample(metrics, "cache_entries") == 1
    assert sample(metrics, "cache_bytes") == public_size
    cache.clear("era_changed")
    assert sample(metrics, "cache_invalidations_total", scope="public", reason="era_changed") == 1
    assert sample(metrics, "cache_entries") == 0 and sample(metrics, "cache_bytes") == 0


async def test_an_outcome_that_is_not_shareable_is_neither_kept_nor_handed_to_a_concurrent_caller() -> None:
    # e.g. a result that took the caller's own answers to input requests.
    cache, _, _ = make()
    gate = asyncio.Event()
    load = Loader(Outcome(listing("own-answers", scope="public"), shareable=False), listing("plain"), gate=gate)
    first, second = await concurrently(
        lambda: cache.fetch(TOOLS_KEY, ALICE, load), lambda: cache.fetch(TOOLS_KEY, ALICE, load), release=gate
    )
    assert load.calls == 2
    assert first.message["result"]["tools"][0]["name"] == "own-answers"
    assert second.message["result"]["tools"][0]["name"] == "plain"
    assert len(cache) == 1  # only the plain one was kept
    later = await cache.fetch(TOOLS_KEY, ALICE, load)
    assert load.calls == 2 and later.message["result"]["tools"][0]["name"] == "plain"
