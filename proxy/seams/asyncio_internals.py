"""The one part of asyncio below its public API that the proxy uses: the running task of a loop
read from asyncio's own table, which `asyncio.current_task()` reads through a Python function on
Python 3.11 (13 bytecodes for every request); from 3.12 on that function is C itself.

Where the table is not the dict of running tasks by loop that 3.11 has, `task_of` is
`asyncio.current_task`: the same answer by the public API (`problems()` says why).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

TaskOf = Callable[[asyncio.AbstractEventLoop], "asyncio.Task[Any] | None"]


def problems() -> list[str]:
    """Why asyncio's table of running tasks is not read here (empty: it is)."""
    if sys.version_info >= (3, 12):
        return ["Python 3.12 and later: asyncio.current_task is C already"]
    table = getattr(asyncio.tasks, "_current_tasks", None)
    if not isinstance(table, dict):
        return ["asyncio.tasks._current_tasks is not a dict of running tasks by loop"]
    return []


def _task_of() -> TaskOf:
    if problems():
        return asyncio.current_task
    found: TaskOf = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]
    return found


# The running task of a loop: `task_of(asyncio.get_running_loop())` is asyncio.current_task().
task_of: TaskOf = _task_of()

__all__ = ["problems", "task_of"]
