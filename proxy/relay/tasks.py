"""Tasks with an owner: a scope holds the tasks one object starts (a call, a relay, a stream) until
they end, logs their failures, and ends them with its owner."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class TaskScope:
    """The event loop keeps only weak references to tasks: a scope keeps them alive, and `aclose`
    (the owner's end) cancels what still runs and waits for it."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        if self.closed:
            coroutine.close()
            raise RuntimeError(f"{self._owner} has ended: it starts no more tasks")
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("task_failed", owner=self._owner, task=task.get_name(), error=repr(task.exception()))

    async def drain(self) -> None:
        """Wait for the tasks running now and those they start, without cancelling them (a task of
        the scope may drain it: it does not wait for itself)."""
        current = asyncio.current_task()
        while others := [task for task in self._tasks if task is not current]:
            await asyncio.gather(*others, return_exceptions=True)

    async def aclose(self) -> None:
        """End the scope: cancel its tasks and wait until they are gone."""
        self.closed = True
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class CancelScope:
    """Lets another coroutine cancel the work inside `async with` (a legacy client's
    notifications/cancelled), without a task of its own: the task running the block is cancelled,
    and the cancellation this scope asked for ends at its edge (`cancelled` says so). A cancellation
    from elsewhere (the client went away) goes on as usual."""

    __slots__ = ("_active", "_task", "cancelled")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._active = False
        self.cancelled = False

    async def __aenter__(self) -> CancelScope:
        self._task = asyncio.current_task()
        self._active = True
        return self

    def cancel(self) -> None:
        # Called from another task, so the block's task is suspended inside the block: the
        # CancelledError it gets is raised there, and reaches __aexit__.
        if self._active and not self.cancelled and self._task is not None:
            self.cancelled = True
            self._task.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        self._active = False
        if not self.cancelled or self._task is None:
            return False
        remaining = self._task.uncancel()
        return exc_type is asyncio.CancelledError and remaining == 0
