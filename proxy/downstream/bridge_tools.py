"""A modern client's tool calls through the bridge (downstream/bridge.py) carry the Mcp-Param-*
headers an HTTP client's must: each tool's x-mcp-header annotations are learnt, in the proxy's one
registry of them (relay/tool_headers.py), from the tools/list replies that pass, or fetched for a
call to a tool not seen yet; stdio carries no headers to mirror from
(2026-07-28/basic/transports/streamable-http.mdx §Schema Extension)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from ..protocol import jsonrpc, meta
from ..protocol.headers import param_header_values
from ..relay.tool_headers import ToolHeaders, unlisted

Ask = Callable[[dict[str, Any]], Awaitable[Any]]  # the endpoint's answer to a request of the bridge's own
_CALLER = ""  # the bridge serves one client: the registry's one caller


class BridgeToolHeaders:
    def __init__(self, upstream: str) -> None:
        self._registry = ToolHeaders(upstream)
        self._ids = itertools.count()  # of the bridge's own tools/list requests

    def listed(self, request_id: Any) -> Callable[[Any], Any]:
        """What the reply to the client's tools/list `request_id` becomes once its tools are learnt
        (a tool whose annotations are invalid withheld)."""

        def learn(reply: Any) -> Any:
            if not (
                isinstance(reply, dict) and reply.get("id") == request_id and isinstance(reply.get("result"), dict)
            ):
                return reply
            return {**reply, "result": self._registry.learn(_CALLER, reply["result"])}

        return learn

    async def call_headers(self, params: dict[str, Any], ask: Ask) -> dict[str, str]:
        """The Mcp-Param-* headers of a tools/call with `params` (its tool's annotations fetched
        through `ask` first if it is not known yet)."""
        name = params.get("name")
        if not isinstance(name, str):
            return {}
        known = self._registry.known(_CALLER, name)
        if known is None:
            known = await self._registry.fetch(
                _CALLER, name, functools.partial(self._list_page, _envelope(params), ask)
            )
        return param_header_values(known, params.get("arguments")) if known else {}

    async def _list_page(self, envelope: dict[str, Any], ask: Ask, params: dict[str, Any]) -> dict[str, Any]:
        """One tools/list page, asked of the endpoint as the client would."""
        request = jsonrpc.request(f"mcp-era-proxy-tools-{next(self._ids)}", "tools/list", {"_meta": envelope, **params})
        reply = await ask(request)
        result = reply.get("result") if isinstance(reply, dict) else None
        if not isinstance(result, dict):
            raise unlisted(reply.get("error") if isinstance(reply, dict) else reply)
        return result


def _envelope(call_params: dict[str, Any]) -> dict[str, Any]:
    """The `_meta` the bridge's own tools/list requests carry: the call's version and capabilities."""
    request_meta = meta.meta_of(call_params) or {}
    return {k: v for k, v in request_meta.items() if k in (meta.PROTOCOL_VERSION, meta.CLIENT_CAPABILITIES)}
