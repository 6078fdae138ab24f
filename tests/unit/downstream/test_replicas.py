"""Steering executed (proxy/downstream/replicas.py): the owner records looked up in the order the
topics ask, lazily, and a replay's owner found gone served here or lost as steer.py says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from proxy.cluster.forward import Forwarder
from proxy.cluster.owners import Owner, OwnerGone
from proxy.downstream.replicas import Steering
from proxy.downstream.steer import LOCAL, Replay, Topic
from proxy.errors import ProxyError
from proxy.relay.tasks.host import LegacyTaskHost
from proxy.state.sessions import LegacySession

A = Owner("boot-a", "10.0.0.1:8081")
B = Owner("boot-b", "10.0.0.2:8081")


class FakeForwarder:
    """The cluster layer's lookups (other replicas only) and its replays, recorded."""

    def __init__(self, state: Owner | None = None, asker: Owner | None = None, gone: bool = False) -> None:
        self.state, self.asker, self.gone = state, asker, gone
        self.looked: list[str] = []
        self.sent: list[tuple[str, Owner, str, Any]] = []

    def state_owner(self, token: object, principal: str) -> Owner | None:
        self.looked.append(f"state {token} {principal}")
        return self.state

    def request_owner(self, request_id: object, session_id: str) -> Owner | None:
        self.looked.append(f"request {request_id} {session_id}")
        return self.asker

    def stream_owner(self, holder: str) -> Owner | None:
        self.looked.append(f"stream {holder}")
        boot, at, address = holder.partition("@")
        return Owner(boot, address) if at and boot != "self" else None

    async def replay(self, request: Any, raw: bytes, owner: Owner, *, kind: str, request_id: Any = None) -> Any:
        self.sent.append(("replay", owner, kind, request_id))
        if self.gone:
            raise OwnerGone("owner_gone", "connection refused")
        return "the owner's reply"

    async def deliver(self, request: Any, message: Any, owner: Owner, *, kind: str = "deliver") -> bool:
        self.sent.append(("deliver", owner, kind, message.get("id")))
        return not self.gone


class FakeTasks:
    def __init__(self, runner: str) -> None:
        self.runner = runner
        self.asked: list[tuple[str, Any]] = []

    async def runner_of(self, principal: str, message: Any) -> str:
        self.asked.append((principal, message["params"]["taskId"]))
        return self.runner


def steering(forwarder: FakeForwarder | None, tasks: FakeTasks | None = None) -> Steering:
    return Steering(cast(Forwarder | None, forwarder), cast(LegacyTaskHost | None, tasks))


SESSION = cast(LegacySession, SimpleNamespace(id="s-1", principal="alice", stream_owner="boot-b@10.0.0.2:8081"))
RETRY = {"jsonrpc": "2.0", "id": 5, "method": "tasks/cancel", "params": {"taskId": "t1", "requestState": "rs"}}


async def test_a_single_replica_serves_everything_here_and_looks_nothing_up() -> None:
    tasks = FakeTasks("boot-b@10.0.0.2:8081")
    one = steering(None, tasks)
    assert await one.decide((Topic.PARKED_CALL, Topic.TASK), RETRY, "alice") == LOCAL
    assert await one.decide((Topic.SUBSCRIPTION,), {"id": 1}, "alice", SESSION) == LOCAL
    assert tasks.asked == [] and not one.forwarding and one.stream_holder("boot-b@x:1") is None


async def test_the_parked_call_is_asked_first_and_the_task_record_not_read_when_it_decides() -> None:
    forwarder, tasks = FakeForwarder(state=A), FakeTasks("boot-b@10.0.0.2:8081")
    assert await steering(forwarder, tasks).decide((Topic.PARKED_CALL, Topic.TASK), RETRY, "alice") == Replay(
        A, "resume"
    )
    assert forwarder.looked == ["state rs alice"] and tasks.asked == []


async def test_a_parked_call_held_here_leaves_the_task_to_its_runner() -> None:
    forwarder, tasks = FakeForwarder(state=None), FakeTasks("boot-b@10.0.0.2:8081")
    assert await steering(forwarder, tasks).decide((Topic.PARKED_CALL, Topic.TASK), RETRY, "alice") == Replay(B, "task")
    assert tasks.asked == [("alice", "t1")]


async def test_without_a_task_host_a_task_request_is_served_here() -> None:
    assert await steering(FakeForwarder()).decide((Topic.TASK,), RETRY, "alice") == LOCAL


async def test_a_subscription_goes_to_the_stream_holder_and_an_answer_to_the_asker() -> None:
    forwarder = FakeForwarder(asker=A)
    steer = steering(forwarder)
    assert await steer.decide((Topic.SUBSCRIPTION,), {"id": 1}, "alice", SESSION) == Replay(B, "subscribe")
    assert await steer.decide((Topic.ANSWER,), {"id": "srq"}, "alice", SESSION) == Replay(A, "deliver")
    assert forwarder.looked == ["stream boot-b@10.0.0.2:8081", "request srq s-1"]
    assert steer.stream_holder("") is None and steer.stream_holder("self@x:1") is None


async def test_a_replay_copies_the_owners_reply() -> None:
    forwarder = FakeForwarder()
    assert await steering(forwarder).replay(cast(Any, None), b"{}", Replay(B, "task"), request_id=5) == (
        "the owner's reply"
    )
    assert forwarder.sent == [("replay", B, "task", 5)]


@pytest.mark.parametrize("kind", ["subscribe", "task"])
async def test_an_owner_gone_leaves_the_request_to_be_served_here(kind: Any) -> None:
    assert await steering(FakeForwarder(gone=True)).replay(cast(Any, None), b"{}", Replay(B, kind)) is None


async def test_a_parked_calls_owner_gone_loses_the_call() -> None:
    with pytest.raises(ProxyError) as lost:
        await steering(FakeForwarder(gone=True)).replay(cast(Any, None), b"{}", Replay(A, "resume"), request_id=5)
    assert lost.value.data == {"reason": "upstream_call_lost", "reissue": True}


async def test_a_delivery_says_whether_the_owner_took_it() -> None:
    assert await steering(FakeForwarder()).deliver(cast(Any, None), {"id": "srq"}, Replay(A, "deliver"))
    gone = FakeForwarder(gone=True)
    assert not await steering(gone).deliver(cast(Any, None), {"id": "srq"}, Replay(A, "subscribe"))
    assert gone.sent == [("deliver", A, "subscribe", "srq")]
