"""A legacy session's resource subscriptions through its upstream listen
(proxy/relay/session_listens.py; docs/translation.md §3.7)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from proxy.errors import ProxyError
from proxy.protocol import jsonrpc
from proxy.relay.session_listens import SessionListens, Translated, covers, wants
from proxy.upstream.errors import UpstreamProtocolError

JSONDict = dict[str, Any]


class Store:
    def __init__(self) -> None:
        self.saved: list[tuple[frozenset[str], tuple[str, ...]]] = []

    async def save(self, session: Any, fields: tuple[str, ...]) -> None:
        self.saved.append((frozenset(session.subscriptions), fields))


class Listener:
    """The caller's upstream listen: each serve acknowledges `ack`, or fails."""

    def __init__(self, ack: JSONDict | None) -> None:
        self.ack = ack
        self.refreshes = 0
        self.renewals = 0

    async def serve(self, wanted: JSONDict) -> JSONDict:
        self.refreshes += 1
        if self.ack is None:
            raise UpstreamProtocolError("up", "the listen broke")
        return self.ack

    def renew_later(self) -> None:
        self.renewals += 1


def session(subscribe: bool = True) -> Any:
    return SimpleNamespace(server_capabilities={"resources": {"subscribe": subscribe}}, subscriptions=frozenset())


def runtime(listener: Listener) -> Any:
    live = Translated()
    live.listen = listener  # type: ignore[assignment]  # joined already
    return SimpleNamespace(live=live)


def listens(store: Store) -> SessionListens:
    unused: Any = SimpleNamespace()
    return SessionListens(unused, unused, store, unused, unused, itertools.count(1), lambda session: None)


async def test_a_subscription_is_kept_once_the_listen_acknowledges_it() -> None:
    store, listener, current = Store(), Listener({"resourceSubscriptions": ["file:///a"]}), session()
    await listens(store).subscribe(current, runtime(listener), "file:///a")
    assert current.subscriptions == {"file:///a"} and listener.refreshes == 1
    assert store.saved == [(frozenset({"file:///a"}), ("subscriptions",))]


@pytest.mark.parametrize("ack", [{"resourceSubscriptions": []}, None])
async def test_a_subscription_not_acknowledged_is_refused_and_dropped_again(ack: JSONDict | None) -> None:
    store, current = Store(), session()
    with pytest.raises(ProxyError) as refused:
        await listens(store).subscribe(current, runtime(Listener(ack)), "file:///a")
    assert refused.value.code == jsonrpc.INTERNAL_ERROR
    assert current.subscriptions == frozenset()
    assert [subscriptions for subscriptions, _ in store.saved] == [frozenset({"file:///a"}), frozenset()]


async def test_an_upstream_without_subscriptions_refuses_them_at_once() -> None:
    store, listener = Store(), Listener({})
    with pytest.raises(ProxyError) as refused:
        await listens(store).subscribe(session(subscribe=False), runtime(listener), "file:///a")
    assert refused.value.code == jsonrpc.METHOD_NOT_FOUND
    assert store.saved == [] and listener.refreshes == 0


async def test_unsubscribing_filters_at_once_and_re_listens_in_the_background() -> None:
    store, current, listener = Store(), session(), Listener({})
    current.subscriptions = frozenset({"file:///a", "file:///b"})
    await listens(store).unsubscribe(current, runtime(listener), "file:///a")
    assert current.subscriptions == {"file:///b"} and listener.renewals == 1


LISTS = {"tools": {"listChanged": True}, "resources": {"subscribe": True}}


def heard(subscriptions: set[str], list_changes: bool, method: str, params: JSONDict | None = None) -> bool:
    state: Any = SimpleNamespace(server_capabilities=LISTS, subscriptions=frozenset(subscriptions))
    return wants(state, list_changes, jsonrpc.notification(method, params))


def test_a_session_hears_updates_only_of_what_it_subscribes_to_and_list_changes_once_it_streams() -> None:
    assert heard({"file:///a"}, False, "notifications/resources/updated", {"uri": "file:///a"})
    assert not heard({"file:///a"}, True, "notifications/resources/updated", {"uri": "file:///b"})
    assert heard(set(), True, "notifications/tools/list_changed")
    assert not heard(set(), False, "notifications/tools/list_changed")
    assert not heard(set(), True, "notifications/prompts/list_changed")  # not advertised upstream
    assert not heard({"file:///a"}, True, "notifications/message", {"level": "error"})


def test_a_running_listen_covers_a_filter_it_asks_for_all_of() -> None:
    asked = {"toolsListChanged": True, "resourceSubscriptions": ["file:///a", "file:///b"]}
    assert covers(asked, {"resourceSubscriptions": ["file:///b"]})
    assert covers(asked, {"toolsListChanged": True})
    assert not covers(asked, {"resourceSubscriptions": ["file:///c"]})
    assert not covers(asked, {"promptsListChanged": True})


class Racing(Store):
    """While a save is awaited, another request of the same session resolves: its copy of the
    session, read before the save, becomes the runtime's (LegacySessionHost.resolve)."""

    def __init__(self, held: Any, stale: Any) -> None:
        super().__init__()
        self.held, self.stale = held, stale

    async def save(self, session: Any, fields: tuple[str, ...]) -> None:
        await super().save(session, fields)
        self.held.session = self.stale


class Union(Listener):
    """Acknowledges what the runtime's session subscribes to: the caller's listen's filter is the
    union of its members' runtimes' sessions."""

    def __init__(self) -> None:
        super().__init__(None)
        self.held: Any = None

    async def serve(self, wanted: JSONDict) -> JSONDict:
        self.refreshes += 1
        return {"resourceSubscriptions": sorted(self.held.session.subscriptions)}


async def test_a_subscription_is_acknowledged_though_another_request_of_the_session_resolved_meanwhile() -> None:
    """Seen with three replicas on a shared store: the other request's older copy, made the runtime's
    while the subscription was saved, left it out of the listen's filter ("did not acknowledge")."""
    listener, current = Union(), session()
    held = runtime(listener)
    held.session, listener.held = current, held
    await listens(Racing(held, session())).subscribe(current, held, "file:///a")
    assert current.subscriptions == {"file:///a"} and held.session is current
