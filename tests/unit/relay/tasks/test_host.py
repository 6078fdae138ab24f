"""What a hosted task's channel answers in place of a request's (proxy/relay/tasks/host.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from proxy.relay.channel import Caller
from proxy.relay.tasks.host import TaskChannel


def channel(expires_at: float, now: float, latest: Caller | None = None) -> TaskChannel:
    host: Any = SimpleNamespace(now=lambda: now)
    live: Any = SimpleNamespace(record=SimpleNamespace(expires_at=expires_at, task_id="t1"), latest=latest)
    return TaskChannel(host, live)


def test_a_task_call_may_take_as_long_as_the_task_is_kept_not_the_request_timeout() -> None:
    assert channel(expires_at=160.0, now=100.0).exchange_bound_s(30.0) == 60.0
    assert channel(expires_at=100.0, now=120.0).exchange_bound_s(30.0) == 0.001  # expired: at once


def test_a_task_rounds_are_not_resumable_and_it_streams() -> None:
    task_channel = channel(expires_at=160.0, now=100.0)
    assert not task_channel.resumable and task_channel.can_stream


def test_a_task_channel_names_the_latest_caller_of_its_task() -> None:
    caller = Caller("alice", {"authorization": "Bearer new"})
    assert channel(160.0, 100.0).latest is None
    assert channel(160.0, 100.0, caller).latest is caller
