"""Which tool parameters travel as headers: the `x-mcp-header` annotations of each caller's tools,
learnt from the tools/list answers that pass through and, for a tool not seen yet, from a walk of
tools/list (docs/translation.md §3.4)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..errors import ProxyError
from ..protocol import legacy_to_modern as l2m
from ..protocol.headers import ParamHeader

JSONDict = dict[str, Any]
# One tools/list page for a caller: `params` in, the page's result out (None: no result).
ListPage = Callable[[JSONDict], Awaitable[JSONDict | None]]
log = structlog.get_logger(__name__)

TOOLS_REFRESH_S = 5.0
_PAGES_MAX = 100  # a tools/list walk stops there, whatever the cursors say


class _Registry:
    """One caller's tools: their annotations, and when tools/list was last walked for them."""

    __slots__ = ("fetched_at", "tools")

    def __init__(self) -> None:
        self.tools: dict[str, tuple[ParamHeader, ...]] = {}
        self.fetched_at: float | None = None


class ToolHeaders:
    """Per-caller registry of `x-mcp-header` annotations learnt from tools/list."""

    def __init__(
        self,
        upstream: str,
        refresh_s: float = TOOLS_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._upstream = upstream  # named in the log lines
        self._refresh_s = refresh_s
        self._clock = clock
        self._callers: dict[str, _Registry] = {}

    def learn(self, principal: str, result: JSONDict) -> JSONDict:
        """Note the annotations of a tools/list page; the page as the client gets it (tools with
        invalid annotations withheld)."""
        page = l2m.screen_tools(result)
        for name, reason in page.rejected:
            log.warning("tool_withheld", upstream=self._upstream, tool=name, reason=reason)
        registry = self._callers.setdefault(principal, _Registry())
        for tool in page.result.get("tools") or ():
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                registry.tools[tool["name"]] = page.headers.get(tool["name"], ())
        return page.result

    def forget(self, principal: str) -> None:
        """The caller's tools changed (the upstream said the annotations it got are stale)."""
        self._callers.pop(principal, None)

    def known(self, principal: str, name: str) -> tuple[ParamHeader, ...] | None:
        """The tool's annotations if they are known already (the usual case), without a fetch."""
        registry = self._callers.get(principal)
        return registry.tools.get(name) if registry is not None else None

    async def fetch(self, principal: str, name: str, list_page: ListPage) -> tuple[ParamHeader, ...]:
        """A tool whose annotations are not known yet: learn them from tools/list, at most once
        per `refresh_s` (an unknown tool then has none)."""
        registry = self._callers.get(principal)
        now = self._clock()
        if registry is None or registry.fetched_at is None or now - registry.fetched_at > self._refresh_s:
            await self._walk(principal, list_page)
            registry = self._callers.get(principal)
        return registry.tools.get(name, ()) if registry else ()

    async def _walk(self, principal: str, list_page: ListPage) -> None:
        """Walk every tools/list page so tools/call can mirror annotated arguments."""
        registry = self._callers.setdefault(principal, _Registry())
        registry.fetched_at = self._clock()
        cursor: Any = None
        for _ in range(_PAGES_MAX):
            params: JSONDict = {"cursor": cursor} if cursor is not None else {}
            try:
                result = await list_page(params)
            except ProxyError as exc:
                log.warning("tools_prefetch_failed", upstream=self._upstream, error=exc.message)
                return
            if result is None:
                return
            self.learn(principal, result)
            cursor = result.get("nextCursor")
            if cursor is None:
                return
