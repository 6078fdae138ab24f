"""Which tool parameters travel as headers, per caller (proxy/relay/tool_headers.py)."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from proxy import errors
from proxy.protocol import jsonrpc
from proxy.relay.tool_headers import ToolHeaders

JSONDict = dict[str, Any]


def tool(name: str, header: Any = None) -> JSONDict:
    properties: JSONDict = {"region": {"type": "string"}}
    if header is not None:
        properties["region"]["x-mcp-header"] = header
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


class Pages:
    """A tools/list the registry walks: the pages, and the params each request carried."""

    def __init__(self, *pages: JSONDict | None, fail: bool = False) -> None:
        self.pages = list(pages)
        self.asked: list[JSONDict] = []
        self.fail = fail

    async def __call__(self, params: JSONDict) -> JSONDict | None:
        self.asked.append(params)
        if self.fail:
            raise errors.ProxyError(jsonrpc.INTERNAL_ERROR, "upstream down")
        return self.pages.pop(0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tools_list_page_teaches_the_callers_annotations_and_no_one_elses() -> None:
    registry = ToolHeaders("up")
    page = {"tools": [tool("weather", "Region"), tool("plain")]}
    assert registry.learn("alice", page) == page
    known = registry.known("alice", "weather")
    assert known is not None and [h.name for h in known] == ["Region"]
    assert registry.known("alice", "plain") == ()
    assert registry.known("alice", "other") is None
    assert registry.known("bob", "weather") is None


def test_a_tool_with_invalid_annotations_is_withheld_and_reported() -> None:
    registry = ToolHeaders("up")
    with capture_logs() as logs:
        result = registry.learn("alice", {"tools": [tool("bad", ""), tool("good")]})
    assert [t["name"] for t in result["tools"]] == ["good"]
    assert registry.known("alice", "bad") is None
    assert [(e["event"], e["tool"], e["upstream"]) for e in logs] == [("tool_withheld", "bad", "up")]


def test_forgetting_a_caller_drops_what_was_learnt() -> None:
    registry = ToolHeaders("up")
    registry.learn("alice", {"tools": [tool("weather", "Region")]})
    registry.forget("alice")
    registry.forget("nobody")
    assert registry.known("alice", "weather") is None


async def test_an_unknown_tool_walks_every_tools_list_page() -> None:
    registry = ToolHeaders("up")
    pages = Pages({"tools": [tool("a")], "nextCursor": "c1"}, {"tools": [tool("weather", "Region")]})
    found = await registry.fetch("alice", "weather", pages)
    assert [h.name for h in found] == ["Region"]
    assert pages.asked == [{}, {"cursor": "c1"}]
    assert registry.known("alice", "a") == ()


async def test_tools_list_is_walked_at_most_once_per_refresh_interval() -> None:
    clock = Clock()
    registry = ToolHeaders("up", refresh_s=5.0, clock=clock)
    pages = Pages({"tools": []}, {"tools": [tool("late", "Late")]})
    assert await registry.fetch("alice", "late", pages) == ()
    clock.now += 5.0
    assert await registry.fetch("alice", "late", pages) == ()  # not yet: an unknown tool has none
    assert len(pages.asked) == 1
    clock.now += 0.1
    assert [h.name for h in await registry.fetch("alice", "late", pages)] == ["Late"]
    assert len(pages.asked) == 2


async def test_a_failed_or_empty_walk_leaves_the_tool_without_annotations() -> None:
    registry = ToolHeaders("up")
    with capture_logs() as logs:
        assert await registry.fetch("alice", "weather", Pages(fail=True)) == ()
    assert [(e["event"], e["error"]) for e in logs] == [("tools_prefetch_failed", "upstream down")]
    assert await ToolHeaders("up").fetch("alice", "weather", Pages(None)) == ()


async def test_a_walk_stops_after_a_hundred_pages_whatever_the_cursors_say() -> None:
    registry = ToolHeaders("up")
    pages = Pages(*({"tools": [], "nextCursor": "again"} for _ in range(101)))
    assert await registry.fetch("alice", "weather", pages) == ()
    assert len(pages.asked) == 100
