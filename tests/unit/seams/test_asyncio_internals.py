"""The one part of asyncio below its public API that the proxy relies on
(proxy/seams/asyncio_internals.py): the running task of a loop."""

from __future__ import annotations

import asyncio
import sys

import pytest

from proxy.seams import asyncio_internals as seam


def test_the_running_task_is_read_from_asyncio_s_own_table_where_it_is_one() -> None:
    if sys.version_info < (3, 12):
        assert seam.problems() == []
        assert seam.task_of == asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]
    else:
        assert seam.task_of is asyncio.current_task


async def test_the_running_task_of_a_loop_is_asyncio_s_current_task() -> None:
    loop = asyncio.get_running_loop()
    assert seam.task_of(loop) is asyncio.current_task()

    async def inner() -> bool:
        return seam.task_of(loop) is asyncio.current_task()

    assert await asyncio.create_task(inner())


def test_a_table_of_another_shape_is_named_and_the_public_function_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.tasks, "_current_tasks", object(), raising=False)
    if sys.version_info < (3, 12):
        assert seam.problems() == ["asyncio.tasks._current_tasks is not a dict of running tasks by loop"]
    assert seam._task_of() is asyncio.current_task
