"""Assembling the relays: what closes a construction cycle between them (a LateCallback)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class LateCallback(Generic[P]):
    """A callback to an object built after the one that calls it, bound once when that one exists.

    Only for a true construction cycle, where each of two objects needs the other: the cache tells
    the watcher what it stored, and the watcher reads the cache (and the relays that use it); the
    era detector tells the cache and the watcher that the era changed, and the watcher asks the
    detector for the era. The caller is built with this, the callee after it, then `bind` closes
    the loop. Called before it is bound, or bound twice, it raises: a wiring mistake shows at once
    rather than as a call that silently went nowhere."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._target: Callable[P, None] | None = None

    def bind(self, target: Callable[P, None]) -> None:
        if self._target is not None:
            raise RuntimeError(f"{self._name}: bound twice")
        self._target = target

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        target = self._target
        if target is None:
            raise RuntimeError(f"{self._name}: called before it was bound")
        target(*args, **kwargs)
