"""Which tool parameters travel as headers: the `x-mcp-header` annotations of each caller's tools,
learnt from the tools/list answers that pass through and, for a tool not seen yet, from a walk of
tools/list (docs/translation.md §3.4). One registry serves both of the proxy's HTTP clients of a
2026-07-28 endpoint: the translation of legacy clients (relay/legacy_to_modern.py) and the bridge
of modern stdio and HTTP+SSE hosts (downstream/bridge_tools.py)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol import legacy_to_modern as l2m
from ..protocol.headers import ParamHeader
from .scopes import SharedRun

JSONDict = dict[str, Any]
# One tools/list page for a caller: `params` in, the page's result out; ProxyError: there is none.
ListPage = Callable[[JSONDict], Awaitable[JSONDict]]
log = structlog.get_logger(__name__)

TOOLS_REFRESH_S = 5.0
_PAGES_MAX = 100  # a tools/list walk stops there, whatever the cursors say
_NAME_LOGGED_MAX = 200  # a tool's name is the server's to choose: logged this far


def unlisted(error: object) -> ProxyError:
    """What a ListPage raises for a tools/list page answered with `error` instead of a result (a
    JSON-RPC error object, or what stood in its place)."""
    if isinstance(error, dict) and jsonrpc.is_error_object(error):
        return ProxyError(error["code"], error["message"])
    return ProxyError(jsonrpc.INTERNAL_ERROR, "no answer" if error is None else str(error))


class _Caller:
    """One caller's tools: their annotations, the walk of tools/list under way, and when the last
    one ended."""

    __slots__ = ("tools", "walk", "walked_at")

    def __init__(self) -> None:
        self.tools: dict[str, tuple[ParamHeader, ...]] = {}
        self.walk = SharedRun[None]()
        self.walked_at: float | None = None


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
        self._callers: dict[str, _Caller] = {}

    def learn(self, principal: str, result: JSONDict) -> JSONDict:
        """Note the annotations of a tools/list page; the page as the client gets it (tools with
        invalid annotations withheld, as an HTTP client must: 2026-07-28/basic/transports/
        streamable-http.mdx §Schema Extension)."""
        return self._learn(self._callers.setdefault(principal, _Caller()), result)

    def forget(self, principal: str) -> None:
        """The caller's tools changed (the upstream said the annotations it got are stale)."""
        self._callers.pop(principal, None)

    def known(self, principal: str, name: str) -> tuple[ParamHeader, ...] | None:
        """The tool's annotations if they are known already (the usual case), without a fetch."""
        caller = self._callers.get(principal)
        return caller.tools.get(name) if caller is not None else None

    async def fetch(self, principal: str, name: str, list_page: ListPage) -> tuple[ParamHeader, ...]:
        """A tool whose annotations are not known yet: learn them from tools/list. One walk at a
        time per caller (a call that comes while one is under way waits for it), and none within
        `refresh_s` of the last one's end (an unknown tool then has none)."""
        caller = self._callers.setdefault(principal, _Caller())
        if caller.walked_at is None or self._clock() - caller.walked_at > self._refresh_s:
            # A walk under way has not set walked_at yet: this joins it rather than starting one.
            await caller.walk.join(lambda: self._walk(caller, list_page))
        return caller.tools.get(name, ())

    def _learn(self, caller: _Caller, result: JSONDict) -> JSONDict:
        page = l2m.screen_tools(result)
        for tool in page.result.get("tools") or ():
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                caller.tools[tool["name"]] = page.headers.get(tool["name"], ())
        for name, reason in page.rejected:
            caller.tools.pop(name, None)  # what it had before no longer holds
            log.warning("tool_withheld", upstream=self._upstream, tool=name[:_NAME_LOGGED_MAX], reason=reason)
        return page.result

    async def _walk(self, caller: _Caller, list_page: ListPage) -> None:
        """Walk every tools/list page so tools/call can mirror annotated arguments, into the record
        of the caller it was started for (a caller forgotten meanwhile starts afresh)."""
        cursor: Any = None
        try:
            for _ in range(_PAGES_MAX):
                params: JSONDict = {"cursor": cursor} if cursor is not None else {}
                try:
                    result = await list_page(params)
                except ProxyError as exc:
                    log.warning("tools_prefetch_failed", upstream=self._upstream, error=exc.message)
                    return
                self._learn(caller, result)
                cursor = result.get("nextCursor")
                if cursor is None:
                    return
        finally:
            caller.walked_at = self._clock()
