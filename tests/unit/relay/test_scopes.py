"""Owned concurrency: task scopes and cancel scopes (proxy/relay/scopes.py)."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from structlog.testing import capture_logs

from proxy.relay.scopes import CancelScope, Deadline, TaskScope, task_of

WAIT = 5.0


async def test_a_cancel_scope_ends_the_cancellation_it_asked_for_at_its_edge() -> None:
    started, reached = asyncio.Event(), []
    scope = CancelScope()

    async def work() -> str:
        with scope:
            started.set()
            await asyncio.Event().wait()
        reached.append("after the block")
        await asyncio.sleep(0)  # no cancellation is left pending for the task
        return "went on"

    task = asyncio.create_task(work())
    async with asyncio.timeout(WAIT):
        await started.wait()
        scope.cancel()
        assert await task == "went on"
    assert scope.cancelled and reached == ["after the block"]


async def test_a_cancellation_from_elsewhere_goes_on_through_a_cancel_scope() -> None:
    started = asyncio.Event()
    scope = CancelScope()

    async def work() -> None:
        with scope:
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    async with asyncio.timeout(WAIT):
        await started.wait()
        scope.cancel()
        task.cancel()  # the client went away too
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_cancelling_a_scope_that_has_ended_does_nothing() -> None:
    scope = CancelScope()
    with scope:
        pass
    scope.cancel()
    await asyncio.sleep(0)  # would raise CancelledError here if the task had been cancelled
    assert not scope.cancelled


async def test_a_task_scope_holds_its_tasks_logs_failures_and_ends_them_with_its_owner() -> None:
    scope = TaskScope("test")
    blocker = asyncio.Event()

    async def boom() -> None:
        raise ValueError("boom")

    long = scope.spawn(blocker.wait())
    with capture_logs() as logs:
        failing = scope.spawn(boom(), name="boom")
        async with asyncio.timeout(WAIT):
            await asyncio.wait({failing})
            await asyncio.sleep(0)  # the done callback runs on the next iteration
    assert [(e["event"], e["owner"], e["task"]) for e in logs] == [("task_failed", "test", "boom")]
    assert len(scope) == 1
    async with asyncio.timeout(WAIT):
        await scope.aclose()
    assert long.cancelled() and len(scope) == 0
    with pytest.raises(RuntimeError):
        scope.spawn(asyncio.sleep(0))


async def test_draining_a_scope_waits_for_its_tasks_and_a_task_may_drain_its_own_scope() -> None:
    scope = TaskScope("test")
    done: list[str] = []

    async def child() -> None:
        await asyncio.sleep(0)
        done.append("child")

    async def parent() -> None:
        scope.spawn(child())
        await scope.drain()  # does not wait for itself
        done.append("parent")

    async with asyncio.timeout(WAIT):
        scope.spawn(parent())
        await scope.drain()
    assert done == ["child", "parent"]


@pytest.mark.parametrize("scope_type", [CancelScope, Deadline])
async def test_a_scope_with_a_deadline_ends_the_work_as_a_timeout_once_it_has_passed(
    scope_type: type[CancelScope],
) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(WAIT):  # the outer bound of the test only
            with scope_type(0.01) as scope:
                await asyncio.Event().wait()
    assert scope.timed_out and scope.cancelled
    await asyncio.sleep(0)  # no cancellation is left pending for the task


async def test_work_that_ends_before_its_deadline_is_not_disturbed() -> None:
    with CancelScope(WAIT) as scope:
        await asyncio.sleep(0)
    assert not scope.timed_out and not scope.cancelled
    await asyncio.sleep(0)


@pytest.mark.parametrize("scope_type", [CancelScope, Deadline])
async def test_a_deadline_inside_a_scope_cancelled_from_elsewhere_lets_the_outer_cancellation_win(
    scope_type: type[CancelScope],
) -> None:
    started = asyncio.Event()
    outer = CancelScope()

    async def work() -> str:
        with outer:
            with scope_type(WAIT):
                started.set()
                await asyncio.Event().wait()
        return "cancelled by the client"

    task = asyncio.create_task(work())
    async with asyncio.timeout(WAIT):
        await started.wait()
        outer.cancel()
        assert await task == "cancelled by the client"


async def test_work_that_ends_before_its_deadline_is_not_disturbed_and_the_timer_is_gone() -> None:
    with Deadline(0.01) as deadline:
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # past the deadline: nothing is cancelled
    assert not deadline.timed_out and not deadline.cancelled


async def test_a_deadline_swallows_nothing_not_even_a_cancellation_through_it() -> None:
    started = asyncio.Event()
    deadline = Deadline(WAIT)

    async def work() -> None:
        with deadline:
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    async with asyncio.timeout(WAIT):
        await started.wait()
        deadline.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert deadline.cancelled and not deadline.timed_out


async def test_a_cancellation_from_elsewhere_goes_on_through_a_deadline_that_passed_too() -> None:
    started = asyncio.Event()

    async def work() -> None:
        with Deadline(0.01):
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                asyncio.current_task().cancel()  # type: ignore[union-attr]  # the client went away as well
                await asyncio.sleep(0)

    task = asyncio.create_task(work())
    async with asyncio.timeout(WAIT):
        await started.wait()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_scope_holds_the_task_asyncio_says_is_running() -> None:
    async def inside() -> None:
        assert task_of(asyncio.get_running_loop()) is asyncio.current_task()
        with CancelScope() as scope, Deadline(WAIT) as deadline:
            assert scope._task is deadline._task is asyncio.current_task()

    await inside()
    await asyncio.create_task(inside())


async def test_a_task_scope_whose_tasks_have_ended_is_small() -> None:
    """One is held per legacy session (bench/streams.py), which starts a task now and then: what
    held the tasks is not kept once they have ended (a set keeps its 216 bytes)."""
    tracemalloc.start()
    try:
        scopes = [TaskScope("test") for _ in range(1000)]
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*(scope.spawn(asyncio.sleep(0)) for scope in scopes))
        assert all(len(scope) == 0 for scope in scopes)
        held = tracemalloc.get_traced_memory()[0]
        count = len(scopes)
        scopes.clear()  # what the scopes hold is freed with them
        per_scope = (held - tracemalloc.get_traced_memory()[0]) / count
    finally:
        tracemalloc.stop()
    assert per_scope < 120, per_scope
