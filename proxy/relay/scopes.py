"""Scopes of asyncio tasks (MCP tasks live in relay/tasks/): a scope holds the tasks one object
starts (a call, a relay, a stream) until they end, logs their failures, and ends them with its owner."""

from __future__ import annotations

import asyncio
from asyncio import get_running_loop
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Literal, Self, TypeVar

import structlog

from ..seams.asyncio_internals import task_of

log = structlog.get_logger(__name__)
T = TypeVar("T")


class TaskScope:
    """The event loop keeps only weak references to tasks: a scope keeps them alive, and `aclose`
    (the owner's end) cancels what still runs and waits for it. One is held per legacy session,
    mostly with no task running: its set is made for the tasks running and dropped when the last
    ends (an empty set is 216 bytes, and one keeps its table once it had a task)."""

    __slots__ = ("_owner", "_tasks", "closed")

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[Any]] | None = None
        self.closed = False

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        if self.closed:
            coroutine.close()
            raise RuntimeError(f"{self._owner} has ended: it starts no more tasks")
        task = asyncio.create_task(coroutine, name=name)
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def __len__(self) -> int:
        return len(self._tasks) if self._tasks is not None else 0

    def _done(self, task: asyncio.Task[Any]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
            if not self._tasks:
                self._tasks = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("task_failed", owner=self._owner, task=task.get_name(), error=repr(task.exception()))

    def _others(self) -> list[asyncio.Task[Any]]:
        current = asyncio.current_task()
        return [task for task in self._tasks or () if task is not current]

    async def drain(self) -> None:
        """Wait for the tasks running now and those they start, without cancelling them (a task of
        the scope may drain it: it does not wait for itself)."""
        while others := self._others():
            await asyncio.gather(*others, return_exceptions=True)

    async def aclose(self) -> None:
        """End the scope: cancel its tasks and wait until they are gone."""
        self.closed = True
        tasks = self._others()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class SharedRun(Generic[T]):
    """One run of a job at a time, owned here and shared by its callers: a caller that stops waiting
    (its own timeout) leaves it running, and the next caller waits for that run instead of starting
    another; `aclose` (the owner's end) cancels it. `on_done` sees every run end, waited for or not.
    For probes that must not be cut short: one that starts a stdio server would kill it still
    starting, and start another at the next call."""

    def __init__(self, on_done: Callable[[asyncio.Future[T]], None] | None = None) -> None:
        self._on_done = on_done
        self._run: asyncio.Future[T] | None = None

    async def join(self, start: Callable[[], Awaitable[T]]) -> T:
        """The outcome of the run going on, or of one `start()` begins now."""
        run = self._run
        if run is None or run.done():
            run = self._run = asyncio.ensure_future(start())
            run.add_done_callback(self._ended)
        return await asyncio.shield(run)

    def _ended(self, run: asyncio.Future[T]) -> None:
        if not run.cancelled():
            run.exception()  # retrieved: its callers may all have stopped waiting
        if self._on_done is not None:
            self._on_done(run)

    async def aclose(self) -> None:
        run, self._run = self._run, None
        if run is not None and not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


class CancelScope:
    """Lets another coroutine, or a deadline, cancel the work inside `with` without a task of its
    own: the task running the block is cancelled, and the cancellation this scope asked for ends at
    its edge: as nothing (`cancelled` says so), or as TimeoutError when its deadline passed. A
    cancellation from elsewhere (the client went away) goes on as usual.

    A plain context manager: entering and leaving awaits nothing, so it costs no coroutine (it runs
    for every request). The work inside is awaiting whenever the scope is cancelled, by another
    task or by its timer, so the CancelledError is raised inside the block.
    """

    __slots__ = ("_active", "_task", "_timeout_s", "_timer", "cancelled", "timed_out")

    # `_task` and `_timer` are set on entering (a timer only with a deadline): `_active` guards
    # every read of `_task`, and `_timeout_s` says whether there is a timer.
    _task: asyncio.Task[Any] | None
    _timer: asyncio.TimerHandle

    def __init__(self, timeout_s: float | None = None) -> None:
        self._timeout_s = timeout_s
        self._active = False
        self.cancelled = False
        self.timed_out = False

    def __enter__(self) -> Self:
        loop = get_running_loop()
        self._task = task_of(loop)
        self._active = True
        if self._timeout_s is not None:
            self._timer = loop.call_later(self._timeout_s, self._expire)
        return self

    def _expire(self) -> None:
        if self._active and not self.cancelled:
            self.timed_out = True
            self.cancel()

    def cancel(self) -> None:
        if self._active and not self.cancelled and self._task is not None:
            self.cancelled = True
            self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        self._active = False
        if self._timeout_s is not None:
            self._timer.cancel()
        if not self.cancelled:  # the usual: the work ended by itself
            return False
        assert self._task is not None  # only a scope with a task is cancelled
        if self._task.uncancel() != 0 or exc_type is not asyncio.CancelledError:
            return False  # cancelled from elsewhere too, or the work ended otherwise
        if self.timed_out:
            raise TimeoutError from exc
        return True


class Deadline(CancelScope):
    """A CancelScope with a deadline and nothing else: past it, the work inside ends with
    TimeoutError; it swallows nothing (nobody else cancels through it). Its own __exit__, without
    the checks for a scope without a deadline: it runs for every request."""

    __slots__ = ()

    def __init__(self, timeout_s: float) -> None:
        CancelScope.__init__(self, timeout_s)  # not through super(): no object made per request

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
        self._active = False
        self._timer.cancel()
        if self.cancelled:
            # As CancelScope.__exit__, but what it would swallow (a `cancel()` that was not the
            # timeout) goes on.
            assert self._task is not None  # only a scope with a task is cancelled
            if self._task.uncancel() == 0 and exc_type is asyncio.CancelledError and self.timed_out:
                raise TimeoutError from exc
        return False
