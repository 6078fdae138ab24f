"""A modern client's tool calls through the bridge (downstream/bridge.py) carry the Mcp-Param-*
headers an HTTP client's must: each tool's x-mcp-header annotations are learnt from the tools/list
replies that pass, or fetched for a call to a tool not seen yet; stdio carries no headers to
mirror from (2026-07-28/basic/transports/streamable-http.mdx §Schema Extension)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..protocol import jsonrpc, meta
from ..protocol.headers import ParamHeader, param_header_values
from ..protocol.legacy_to_modern import screen_tools

log = structlog.get_logger(__name__)

_TOOLS_REFRESH_S = 5.0  # a tool still unknown after a walk makes another only after this
_TOOL_PAGES_MAX = 100

Ask = Callable[[dict[str, Any]], Awaitable[Any]]  # the endpoint's answer to a request of the bridge's own


class BridgeToolHeaders:
    def __init__(self) -> None:
        self._known: dict[str, tuple[ParamHeader, ...]] = {}
        self._fetched_at: float | None = None
        self._fetch: asyncio.Task[None] | None = None

    def listed(self, request_id: Any) -> Callable[[Any], Any]:
        """What the reply to the client's tools/list `request_id` becomes once its tools are learnt."""

        def learn(reply: Any) -> Any:
            if not (
                isinstance(reply, dict) and reply.get("id") == request_id and isinstance(reply.get("result"), dict)
            ):
                return reply
            return {**reply, "result": self._learn(reply["result"])}

        return learn

    def _learn(self, result: dict[str, Any]) -> dict[str, Any]:
        """Record a tools/list page's annotations; a tool whose annotations are invalid is withheld,
        as an HTTP client must (2026-07-28/basic/transports/streamable-http.mdx §Schema Extension)."""
        page = screen_tools(result)
        for tool in result.get("tools") or ():
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._known[tool["name"]] = page.headers.get(tool["name"], ())
        for name, reason in page.rejected:
            self._known.pop(name, None)
            log.warning("bridge_tool_withheld", tool=name[:200], reason=reason)
        return page.result

    async def call_headers(self, params: dict[str, Any], ask: Ask) -> dict[str, str]:
        """The Mcp-Param-* headers of a tools/call with `params` (its tool's annotations fetched
        through `ask` first if it is not known yet)."""
        name = params.get("name")
        if not isinstance(name, str):
            return {}
        known = self._known.get(name)
        if known is None:
            await self._fetch_tools(params, ask)
            known = self._known.get(name, ())
        return param_header_values(known, params.get("arguments")) if known else {}

    async def _fetch_tools(self, call_params: dict[str, Any], ask: Ask) -> None:
        """Walk tools/list for the annotations of a tool not seen yet: at most once per
        _TOOLS_REFRESH_S, one walk at a time (concurrent calls wait for the same)."""
        loop = asyncio.get_running_loop()
        if self._fetch is None or self._fetch.done():
            fresh = self._fetched_at is not None and loop.time() - self._fetched_at < _TOOLS_REFRESH_S
            if fresh:
                return
            self._fetched_at = loop.time()
            self._fetch = asyncio.create_task(self._walk_tools(call_params, ask))
        await asyncio.shield(self._fetch)

    async def _walk_tools(self, call_params: dict[str, Any], ask: Ask) -> None:
        request_meta = meta.meta_of(call_params) or {}
        envelope = {k: v for k, v in request_meta.items() if k in (meta.PROTOCOL_VERSION, meta.CLIENT_CAPABILITIES)}
        cursor: Any = None
        for page in range(_TOOL_PAGES_MAX):
            params: dict[str, Any] = {"_meta": envelope}
            if cursor is not None:
                params["cursor"] = cursor
            reply = await ask(jsonrpc.request(f"mcp-era-proxy-tools-{page}", "tools/list", params))
            result = reply.get("result") if isinstance(reply, dict) else None
            if not isinstance(result, dict):
                log.info("bridge_tools_unlisted", error=str(reply.get("error") if isinstance(reply, dict) else reply))
                return
            self._learn(result)
            cursor = result.get("nextCursor")
            if cursor is None:
                return
