"""The legacy sessions of one caller share one upstream `subscriptions/listen`
(proxy/relay/session_listens.py; docs/translation.md §3.7): each session still hears only what it
asked for, callers never share one, and it closes with the caller's last session."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.integration.conftest import Proxy
from tests.support.fake_modern import FakeModern, Listen, notification
from tests.support.legacy_client import LegacyClient
from tests.support.mcp_client import SseReader

WAIT = 10
TOOLS_CHANGED = "notifications/tools/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}


async def streaming(proxy: Proxy, count: int, headers: dict[str, str]) -> list[tuple[LegacyClient, SseReader, Any]]:
    """`count` sessions of the caller `headers`, each holding its GET stream."""
    out = []
    for _ in range(count):
        peer = await proxy.connect(headers=headers)
        response = await peer.get_stream()
        assert response.status == 200
        out.append((peer, SseReader(response), response))
    return out


def open_listens(fake: FakeModern) -> list[Listen]:
    return [listen for listen in fake.listens if not listen.closed.is_set()]


def updated(uri: str) -> dict[str, Any]:
    return notification(UPDATED, {"uri": uri})


async def test_the_sessions_of_one_caller_share_one_upstream_listen(proxy: Proxy, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        sessions = await streaming(proxy, 5, ALICE)
        listen = await fake.wait_listen()
        listen.push(TOOLS_CHANGED)
        received = [await reader.message() for _, reader, _ in sessions]
        for _, _, response in sessions:
            response.close()
    assert len(fake.calls_of("subscriptions/listen")) == 1
    assert listen.call.headers.get("Authorization") == ALICE["Authorization"]
    assert received == [notification(TOOLS_CHANGED)] * 5


async def test_two_callers_never_share_a_listen(proxy: Proxy, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        [(_, alice, alice_stream)] = await streaming(proxy, 1, ALICE)
        alice_listen = await fake.wait_listen(lambda listen: listen.call.headers.get("Authorization") == "Bearer alice")
        [(_, bob, bob_stream)] = await streaming(proxy, 1, BOB)
        bob_listen = await fake.wait_listen(lambda listen: listen.call.headers.get("Authorization") == "Bearer bob")
        alice_listen.push(TOOLS_CHANGED)
        bob_listen.push(PROMPTS_CHANGED)
        heard = await alice.message(), await bob.message()
        alice_stream.close()
        bob_stream.close()
    assert alice_listen is not bob_listen and len(fake.calls_of("subscriptions/listen")) == 2
    assert heard == (notification(TOOLS_CHANGED), notification(PROMPTS_CHANGED))


async def test_each_session_hears_only_the_resources_it_subscribed_to(proxy: Proxy, fake: FakeModern) -> None:
    """The shared listen carries the union of the subscriptions; each session gets its own. Logs
    never travel on a listen: the one pushed there reaches nobody, whatever the session's level."""
    a, b = "file:///a.txt", "file:///b.txt"
    async with asyncio.timeout(WAIT):
        (first, first_reader, first_stream), (second, second_reader, second_stream) = await streaming(proxy, 2, ALICE)
        assert (await first.request("logging/setLevel", {"level": "debug"})).result == {}
        assert (await first.request("resources/subscribe", {"uri": a})).result == {}
        assert (await second.request("resources/subscribe", {"uri": b})).result == {}
        listen = await fake.wait_listen(lambda listen: listen.filter.get("resourceSubscriptions") == [a, b])
        listen.push("notifications/message", {"level": "error", "data": "not for a GET stream"})
        listen.push(UPDATED, {"uri": a})
        listen.push(UPDATED, {"uri": b})
        listen.push(TOOLS_CHANGED)  # the last: whatever a session heard before it, it heard
        first_heard = [await first_reader.message() for _ in range(2)]
        second_heard = [await second_reader.message() for _ in range(2)]
        first_stream.close()
        second_stream.close()
    assert len(open_listens(fake)) == 1
    assert first_heard == [updated(a), notification(TOOLS_CHANGED)]
    assert second_heard == [updated(b), notification(TOOLS_CHANGED)]


async def test_the_listen_closes_when_the_callers_last_session_leaves(proxy: Proxy, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        (first, _, first_stream), (second, reader, second_stream) = await streaming(proxy, 2, ALICE)
        listen = await fake.wait_listen()
        assert (await first.delete()).status == 200
        listen.push(TOOLS_CHANGED)
        assert await reader.message() == notification(TOOLS_CHANGED)  # still served for the other
        assert not listen.closed.is_set()
        assert (await second.delete()).status == 200
        await listen.closed.wait()
        first_stream.close()
        second_stream.close()
    assert open_listens(fake) == [] and len(fake.calls_of("subscriptions/listen")) == 1


async def test_a_subscription_of_one_session_reaches_it_while_the_others_keep_hearing(
    proxy: Proxy, fake: FakeModern
) -> None:
    """The union grows: the new listen is opened and acknowledged before the old one closes, so
    what the old one carries meanwhile still reaches the others."""
    uri = "file:///watched"
    async with asyncio.timeout(WAIT):
        (_, other, other_stream), (subscriber, reader, stream) = await streaming(proxy, 2, ALICE)
        old = await fake.wait_listen()
        fake.ack_gate = asyncio.Event()  # the re-listen waits: the old listen alone serves now
        subscribing = asyncio.create_task(subscriber.request("resources/subscribe", {"uri": uri}))
        await fake.wait_listen(lambda listen: uri in listen.filter.get("resourceSubscriptions", ()), acked=False)
        old.push(TOOLS_CHANGED)
        assert await other.message() == notification(TOOLS_CHANGED)
        assert await reader.message() == notification(TOOLS_CHANGED)
        fake.ack_gate.set()
        assert (await subscribing).result == {}
        await old.closed.wait()
        new = await fake.wait_listen(lambda listen: uri in listen.filter.get("resourceSubscriptions", ()))
        new.push(UPDATED, {"uri": uri})
        new.push(PROMPTS_CHANGED)
        heard = [await reader.message() for _ in range(2)]
        assert await other.message() == notification(PROMPTS_CHANGED)  # not the update: not subscribed
        other_stream.close()
        stream.close()
    assert heard == [updated(uri), notification(PROMPTS_CHANGED)]
    assert len(open_listens(fake)) == 1


async def test_an_unsubscribe_narrows_the_shared_listen_and_the_other_subscriber_keeps_its_updates(
    proxy: Proxy, fake: FakeModern
) -> None:
    a, b = "file:///a.txt", "file:///b.txt"
    async with asyncio.timeout(WAIT):
        (first, first_reader, first_stream), (second, second_reader, second_stream) = await streaming(proxy, 2, ALICE)
        for peer in (first, second):
            assert (await peer.request("resources/subscribe", {"uri": a})).result == {}
        assert (await first.request("resources/subscribe", {"uri": b})).result == {}
        assert (await first.request("resources/unsubscribe", {"uri": b})).result == {}
        narrowed = await fake.wait_listen(
            lambda listen: listen.filter.get("resourceSubscriptions") == [a] and not listen.closed.is_set()
        )
        assert (await first.request("resources/unsubscribe", {"uri": a})).result == {}
        narrowed.push(UPDATED, {"uri": a})
        narrowed.push(TOOLS_CHANGED)
        assert await first_reader.message() == notification(TOOLS_CHANGED)
        assert [await second_reader.message() for _ in range(2)] == [updated(a), notification(TOOLS_CHANGED)]
        first_stream.close()
        second_stream.close()
