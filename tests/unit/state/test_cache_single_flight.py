"""The response cache's single flight: concurrent misses of one key make one load, shared only where
the result may be shared (proxy/state/cache.py; policy: docs/translation.md §5). The helpers are the
cache tests' own (tests/unit/state/test_cache.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.state.test_cache import (
    ALICE,
    ANONYMOUS,
    BOB,
    TOOLS_KEY,
    WAIT,
    Loader,
    concurrently,
    input_required_reply,
    listing,
    make,
    requests_counted,
    sample,
)


async def test_concurrent_misses_of_one_principal_make_one_load() -> None:
    cache, metrics, _ = make()
    gate = asyncio.Event()
    load = Loader(listing("shared"), listing("second-load"), gate=gate)
    outcomes = await concurrently(*[lambda: cache.fetch(TOOLS_KEY, ALICE, load)] * 5, release=gate)
    assert load.calls == 1
    assert all(o.message["result"]["tools"][0]["name"] == "shared" for o in outcomes), outcomes
    assert requests_counted(metrics) == {("miss", "public"): 1, ("shared", "public"): 4}


async def test_concurrent_misses_of_other_principals_join_an_anonymous_load_when_the_result_is_public() -> None:
    cache, metrics, _ = make()
    gate = asyncio.Event()
    load = Loader(listing("open"), listing("second-load"), gate=gate)
    outcomes = await concurrently(
        lambda: cache.fetch(TOOLS_KEY, ANONYMOUS, load),
        lambda: cache.fetch(TOOLS_KEY, ALICE, load),
        lambda: cache.fetch(TOOLS_KEY, BOB, load),
        release=gate,
    )
    assert load.calls == 1
    assert [o.message["result"]["tools"][0]["name"] for o in outcomes] == ["open"] * 3
    assert requests_counted(metrics) == {("miss", "public"): 1, ("shared", "public"): 2}


async def test_concurrent_misses_of_two_vouched_principals_make_one_load_when_the_result_is_public() -> None:
    cache, _, clock = make()
    # Both were served by the upstream before (so either may be given a public entry); the entry expired.
    await cache.fetch(TOOLS_KEY, ALICE, Loader(listing()))
    await cache.fetch(TOOLS_KEY, BOB, Loader(listing()))
    clock.advance(61.0)
    gate = asyncio.Event()
    load = Loader(listing("fresh"), listing("second-load"), gate=gate)
    outcomes = await concurrently(
        lambda: cache.fetch(TOOLS_KEY, ALICE, load), lambda: cache.fetch(TOOLS_KEY, BOB, load), release=gate
    )
    assert [o.message["result"]["tools"][0]["name"] for o in outcomes] == ["fresh", "fresh"]
    assert load.calls == 1


async def test_a_private_result_is_not_shared_with_a_concurrent_caller_of_another_principal() -> None:
    cache, metrics, _ = make()
    gate = asyncio.Event()
    load = Loader(listing("anonymous-view", scope="private"), listing("bob-view", scope="private"), gate=gate)
    anonymous, bob = await concurrently(
        lambda: cache.fetch(TOOLS_KEY, ANONYMOUS, load), lambda: cache.fetch(TOOLS_KEY, BOB, load), release=gate
    )
    assert load.calls == 2
    assert anonymous.message["result"]["tools"][0]["name"] == "anonymous-view"
    assert bob.message["result"]["tools"][0]["name"] == "bob-view"
    assert sample(metrics, "cache_requests_total", result="shared", scope="private") == 0


async def test_a_concurrent_caller_never_shares_an_input_required_result() -> None:
    cache, metrics, _ = make()
    gate = asyncio.Event()
    load = Loader(input_required_reply(), listing("own"), gate=gate)
    first, second = await concurrently(
        lambda: cache.fetch(TOOLS_KEY, ALICE, load), lambda: cache.fetch(TOOLS_KEY, ALICE, load), release=gate
    )
    assert load.calls == 2
    assert first.message["result"]["resultType"] == "input_required"
    assert second.message["result"]["resultType"] == "complete"  # asked on its own: the requestState was not its
    assert sample(metrics, "cache_requests_total", result="shared", scope="none") == 0


async def test_a_failing_load_fails_its_concurrent_callers_too_and_is_not_cached() -> None:
    cache, _, _ = make()
    gate = asyncio.Event()
    failure = ConnectionError("upstream went away")
    load = Loader(failure, listing("later"), gate=gate)
    outcomes = await concurrently(*[lambda: cache.fetch(TOOLS_KEY, ALICE, load)] * 3, release=gate)
    assert load.calls == 1
    assert all(o is failure for o in outcomes), outcomes
    assert len(cache) == 0
    later = await cache.fetch(TOOLS_KEY, ALICE, load)
    assert load.calls == 2 and later.message["result"]["tools"][0]["name"] == "later"


async def test_a_cancelled_load_does_not_cancel_its_concurrent_callers() -> None:
    """The first caller goes away (aiohttp cancels its handler): a concurrent caller must still get
    an answer (by loading itself), not the first caller's CancelledError."""
    cache, _, _ = make()
    gate = asyncio.Event()
    load = Loader(listing("never"), listing("for-the-waiter"), gate=gate)
    loader = asyncio.create_task(cache.fetch(TOOLS_KEY, ALICE, load))
    waiter = asyncio.create_task(cache.fetch(TOOLS_KEY, ALICE, load))
    async with asyncio.timeout(WAIT):
        await load.started.wait()  # tasks start first-in first-out: the waiter now waits on the load
        loader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loader
        gate.set()
        outcome = (await asyncio.gather(waiter, return_exceptions=True))[0]
    assert not isinstance(outcome, BaseException), f"the waiter failed with {outcome!r}"
    assert outcome.message["result"]["tools"][0]["name"] == "for-the-waiter"
