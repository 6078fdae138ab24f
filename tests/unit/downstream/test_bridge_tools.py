"""A bridged modern client's tool calls carry their Mcp-Param-* headers (proxy/downstream/bridge_tools.py):
learnt from the tools/list replies that pass, fetched for a tool not seen yet with the bridge's own
tools/list requests. The registry's rules (one walk at a time, the refresh interval, the page bound)
are relay/tool_headers.py's, tested in tests/unit/relay/test_tool_headers.py."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from proxy.downstream.bridge_tools import BridgeToolHeaders

JSONDict = dict[str, Any]


def tool(name: str, header: Any = None) -> JSONDict:
    properties: JSONDict = {"region": {"type": "string"}}
    if header is not None:
        properties["region"]["x-mcp-header"] = header
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


class Endpoint:
    """The endpoint's answers to the bridge's own tools/list requests, and the requests asked."""

    def __init__(self, *results: JSONDict) -> None:
        self.results = list(results)
        self.asked: list[JSONDict] = []

    async def __call__(self, request: JSONDict) -> Any:
        self.asked.append(request)
        if not self.results:
            return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32603, "message": "down"}}
        return {"jsonrpc": "2.0", "id": request["id"], "result": self.results.pop(0)}


def call(name: object, region: str = "eu") -> JSONDict:
    return {"name": name, "arguments": {"region": region}}


async def test_a_tools_list_reply_that_passes_teaches_the_headers_of_the_calls_and_loses_invalid_tools() -> None:
    tools = BridgeToolHeaders("up")
    reply = {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"tools": [tool("weather", "Region"), tool("plain"), tool("bad", "")]},
    }
    with capture_logs() as logs:
        listed = tools.listed(3)(reply)
    assert listed == {**reply, "result": {"tools": [tool("weather", "Region"), tool("plain")]}}
    assert [(e["event"], e["tool"], e["upstream"]) for e in logs] == [("tool_withheld", "bad", "up")]
    assert tools.listed(4)({"jsonrpc": "2.0", "id": 9, "result": {}}) == {"jsonrpc": "2.0", "id": 9, "result": {}}
    nobody = Endpoint()
    assert await tools.call_headers(call("weather"), nobody) == {"Mcp-Param-Region": "eu"}
    assert await tools.call_headers(call("plain"), nobody) == {}
    assert nobody.asked == []  # both were known


async def test_a_call_to_a_tool_not_seen_yet_walks_the_list_once_with_the_calls_envelope() -> None:
    tools = BridgeToolHeaders("up")
    endpoint = Endpoint({"tools": [tool("other")], "nextCursor": "c1"}, {"tools": [tool("weather", "Region")]})
    params = {**call("weather"), "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "x": 1}}
    assert await tools.call_headers(params, endpoint) == {"Mcp-Param-Region": "eu"}
    assert [r["method"] for r in endpoint.asked] == ["tools/list", "tools/list"]
    assert endpoint.asked[1]["params"]["cursor"] == "c1"
    assert endpoint.asked[0]["params"]["_meta"] == {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    assert len({r["id"] for r in endpoint.asked}) == 2


async def test_a_walk_the_endpoint_refuses_is_logged_and_the_call_goes_without_headers() -> None:
    tools = BridgeToolHeaders("up")
    with capture_logs() as logs:
        assert await tools.call_headers(call("weather"), Endpoint()) == {}
    assert [(e["event"], e["upstream"], e["error"]) for e in logs] == [("tools_prefetch_failed", "up", "down")]


async def test_a_walk_without_an_answer_says_so() -> None:
    async def nothing(request: JSONDict) -> Any:
        return None

    with capture_logs() as logs:
        assert await BridgeToolHeaders("up").call_headers(call("weather"), nothing) == {}
    assert [(e["event"], e["error"]) for e in logs] == [("tools_prefetch_failed", "no answer")]


async def test_a_call_without_a_tool_name_carries_no_headers() -> None:
    endpoint = Endpoint()
    assert await BridgeToolHeaders("up").call_headers(call(7), endpoint) == {}
    assert endpoint.asked == []
