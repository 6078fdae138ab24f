"""Where a client's message is served when replicas share one endpoint: here, or replayed at the
replica that owns what the message is about (docs/design.md §Replicas). One pure decision, no I/O:
the endpoint says what the message is about (`topics`), looks up the owner records of those topics
(downstream/replicas.py, through cluster/forward.py `Forwarder` and the task host), asks `decide`
once, and executes the answer.

What a message can be about, and who owns it:

- a legacy client's `resources/subscribe`/`unsubscribe`: the session's GET stream is fed from the
  upstream listen of the replica holding that stream; the subscription changes there;
- a request about a hosted task (a legacy client's `tasks/result`/`tasks/cancel`, a modern
  client's `tasks/update`/`tasks/cancel` toward a legacy upstream): the replica running its call;
- a modern client's retry carrying `requestState` toward a legacy upstream: the replica where the
  call is parked;
- a legacy client's answer to a server-to-client request: the replica that sent the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from ..cluster.owners import Owner

Kind = Literal["subscribe", "task", "resume", "deliver"]  # the forward's metric label


class Topic(Enum):
    """What a message is about that another replica may own; the value is the forward's kind."""

    SUBSCRIPTION = "subscribe"
    TASK = "task"
    PARKED_CALL = "resume"
    ANSWER = "deliver"

    @property
    def kind(self) -> Kind:
        return _KINDS[self]


_KINDS: dict[Topic, Kind] = {
    Topic.SUBSCRIPTION: "subscribe",
    Topic.TASK: "task",
    Topic.PARKED_CALL: "resume",
    Topic.ANSWER: "deliver",
}

STREAM_SCOPED = frozenset({"resources/subscribe", "resources/unsubscribe"})
LEGACY_TASK_METHODS = frozenset({"tasks/result", "tasks/cancel"})  # a 2025-11-25 client's
MODERN_TASK_METHODS = frozenset({"tasks/update", "tasks/cancel"})  # a 2026-07-28 client's


def legacy_topics(kind: str, method: object) -> tuple[Topic, ...]:
    """What a legacy client's message (in its session) is about; `kind` is jsonrpc.kind's."""
    if kind == "response":
        return (Topic.ANSWER,)
    if kind != "request":
        return ()
    if method in STREAM_SCOPED:
        return (Topic.SUBSCRIPTION,)
    if method in LEGACY_TASK_METHODS:
        return (Topic.TASK,)
    return ()


def modern_topics(method: str, *, legacy_upstream: bool, request_state: bool) -> tuple[Topic, ...]:
    """What a modern client's request is about, in the order its owners are asked. Only a legacy
    upstream's calls park or run as hosted tasks here."""
    if not legacy_upstream:
        return ()
    topics = (Topic.PARKED_CALL,) if request_state else ()
    return (*topics, Topic.TASK) if method in MODERN_TASK_METHODS else topics


@dataclass(frozen=True, slots=True)
class Local:
    """Serve the message here."""


LOCAL = Local()


@dataclass(frozen=True, slots=True)
class Replay:
    """Serve the message at `owner` (a request is replayed there, an answer delivered)."""

    owner: Owner
    kind: Kind

    @property
    def local_if_gone(self) -> bool:
        """When the owner cannot be reached: serve it here (the subscription is made for the
        stream's next home, the task's record answers, the answer may be taken over), except a
        parked call's retry: the call is lost with its replica, and the client must re-issue it."""
        return self.kind != "resume"


def decide(
    topics: tuple[Topic, ...], owners: Mapping[Topic, Owner | None], *, gone: str | None = None
) -> Local | Replay:
    """The first topic whose owner is another replica that can be reached decides; else here.

    `owners`: the other replica each topic's record names (None: this one, none, or nobody
    reachable), as the cluster layer looked it up; a topic not looked up has none. `gone`: the
    boot id of a replica already found gone for this message, never chosen again."""
    for topic in topics:
        owner = owners.get(topic)
        if owner is not None and owner.address is not None and owner.boot != gone:
            return Replay(owner, topic.kind)
    return LOCAL
