"""Steering between replicas (proxy/downstream/steer.py): what a message is about, and whether it is
served here or replayed at the replica owning that. Pure: no aiohttp, no store, no forwarder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cluster.owners import Owner
from proxy.downstream.steer import (
    LOCAL,
    Local,
    Replay,
    Topic,
    decide,
    legacy_topics,
    modern_topics,
)

A = Owner("boot-a", "10.0.0.1:8081")
B = Owner("boot-b", "10.0.0.2:8081")


# ---------------------------------------------------------------- what a message is about


@pytest.mark.parametrize(
    ("kind", "method", "topics"),
    [
        ("request", "resources/subscribe", (Topic.SUBSCRIPTION,)),
        ("request", "resources/unsubscribe", (Topic.SUBSCRIPTION,)),
        ("request", "tasks/result", (Topic.TASK,)),
        ("request", "tasks/cancel", (Topic.TASK,)),
        ("request", "tasks/update", ()),  # a modern client's method: a legacy client's is served here
        ("request", "tools/call", ()),
        ("response", None, (Topic.ANSWER,)),
        ("notification", "notifications/cancelled", ()),
        ("notification", "resources/subscribe", ()),  # only a request changes a subscription
    ],
)
def test_what_a_legacy_clients_message_is_about(kind: str, method: object, topics: tuple[Topic, ...]) -> None:
    assert legacy_topics(kind, method) == topics


@pytest.mark.parametrize(
    ("method", "legacy_upstream", "request_state", "topics"),
    [
        ("tools/call", True, True, (Topic.PARKED_CALL,)),
        ("tools/call", True, False, ()),
        ("tasks/update", True, False, (Topic.TASK,)),
        ("tasks/cancel", True, False, (Topic.TASK,)),
        ("tasks/cancel", True, True, (Topic.PARKED_CALL, Topic.TASK)),  # the parked call first
        ("tasks/result", True, False, ()),  # a legacy client's method
        ("tools/call", False, True, ()),  # a modern upstream parks nothing here
        ("tasks/cancel", False, False, ()),  # ... and runs no hosted task
    ],
)
def test_what_a_modern_clients_request_is_about(
    method: str, legacy_upstream: bool, request_state: bool, topics: tuple[Topic, ...]
) -> None:
    assert modern_topics(method, legacy_upstream=legacy_upstream, request_state=request_state) == topics


# ---------------------------------------------------------------- the decision


@pytest.mark.parametrize(
    ("topic", "kind"),
    [
        (Topic.SUBSCRIPTION, "subscribe"),
        (Topic.TASK, "task"),
        (Topic.PARKED_CALL, "resume"),
        (Topic.ANSWER, "deliver"),
    ],
)
def test_a_message_whose_owner_is_another_replica_is_replayed_there_with_its_kind(topic: Topic, kind: str) -> None:
    assert decide((topic,), {topic: A}) == Replay(A, kind)  # type: ignore[arg-type]


def test_a_message_about_nothing_another_replica_owns_is_served_here() -> None:
    assert decide((), {Topic.TASK: A}) == LOCAL
    assert isinstance(decide((), {}), Local)


def test_an_owner_that_is_this_replica_or_none_means_here() -> None:
    """The cluster layer reports None for this replica's own records and for unreadable ones."""
    assert decide((Topic.SUBSCRIPTION,), {Topic.SUBSCRIPTION: None}) == LOCAL
    assert decide((Topic.TASK,), {}) == LOCAL  # not looked up: no forwarder, no task host


def test_an_owner_nobody_can_reach_means_here() -> None:
    assert decide((Topic.ANSWER,), {Topic.ANSWER: Owner("boot-a", None)}) == LOCAL


def test_the_first_topic_with_an_owner_decides() -> None:
    topics = (Topic.PARKED_CALL, Topic.TASK)
    assert decide(topics, {Topic.PARKED_CALL: A, Topic.TASK: B}) == Replay(A, "resume")
    assert decide(topics, {Topic.PARKED_CALL: None, Topic.TASK: B}) == Replay(B, "task")
    assert decide(topics, {Topic.TASK: B}) == Replay(B, "task")  # the parked call's not looked up


def test_a_replica_found_gone_for_this_message_is_not_chosen_again() -> None:
    """A subscription made here after its stream holder was found gone: told to the stream's new
    holder afterwards, never to the one that was gone."""
    assert decide((Topic.SUBSCRIPTION,), {Topic.SUBSCRIPTION: A}, gone="boot-a") == LOCAL
    assert decide((Topic.SUBSCRIPTION,), {Topic.SUBSCRIPTION: B}, gone="boot-a") == Replay(B, "subscribe")


@pytest.mark.parametrize(("kind", "local"), [("subscribe", True), ("task", True), ("deliver", True), ("resume", False)])
def test_only_a_parked_calls_retry_is_lost_with_its_owner(kind: str, local: bool) -> None:
    """Gone: a subscription is made here for the stream's next home, a task's record answers, an
    answer may be taken over; the parked call is gone with its replica (the client re-issues it)."""
    assert Replay(A, kind).local_if_gone is local  # type: ignore[arg-type]


def test_the_decision_needs_no_aiohttp() -> None:
    script = "import sys, proxy.downstream.steer; sys.exit('aiohttp' in sys.modules)"
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
