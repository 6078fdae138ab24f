"""Fire-and-forget work of a relay (background calls, replies to servers, stream closes)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log = structlog.get_logger("mcp_era_proxy.relay")


class BackgroundTasks:
    """Holds each task until it ends (the event loop keeps only weak references) and logs failures."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background_task_failed", error=str(task.exception()))

    async def drain(self) -> None:
        """Wait for the tasks running now (shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
