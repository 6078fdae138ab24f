"""Which tool parameters travel as headers, per caller (proxy/relay/tool_headers.py): the one
registry of both its users (the legacy clients' translation, and the bridge: test_bridge_tools.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy import errors
from proxy.protocol import jsonrpc
from proxy.relay.tool_headers import ToolHeaders

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for


def tool(name: str, header: Any = None) -> JSONDict:
    properties: JSONDict = {"region": {"type": "string"}}
    if header is not None:
        properties["region"]["x-mcp-header"] = header
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


class Pages:
    """A tools/list the registry walks: the pages, and the params each request carried."""

    def __init__(self, *pages: JSONDict, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.pages = list(pages)
        self.asked: list[JSONDict] = []
        self.fail = fail
        self.gate = gate  # each page waits for it
        self.entered = asyncio.Event()  # a page was asked for

    async def __call__(self, params: JSONDict) -> JSONDict:
        self.asked.append(params)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
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


def test_a_tool_known_before_and_now_invalid_is_known_no_more() -> None:
    registry = ToolHeaders("up")
    registry.learn("alice", {"tools": [tool("weather", "Region")]})
    with capture_logs() as logs:
        registry.learn("alice", {"tools": [tool("weather", "Bad Name")]})
    assert registry.known("alice", "weather") is None
    assert [e["event"] for e in logs] == ["tool_withheld"]


def test_a_withheld_tools_name_is_logged_only_in_part() -> None:
    with capture_logs() as logs:
        ToolHeaders("up").learn("alice", {"tools": [tool("x" * 5000, "")]})
    assert [e["tool"] for e in logs] == ["x" * 200]


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


@pytest.mark.parametrize("first_cancelled", [False, True], ids=["both-wait", "first-cancelled"])
async def test_concurrent_calls_for_an_unseen_tool_share_one_walk_and_get_its_headers(first_cancelled: bool) -> None:
    registry = ToolHeaders("up")
    release = asyncio.Event()
    pages = Pages({"tools": [tool("weather", "Region")]}, gate=release)
    async with asyncio.timeout(WAIT):
        calls = [asyncio.create_task(registry.fetch("alice", "weather", pages)) for _ in range(2)]
        await pages.entered.wait()  # the walk is under way, and both calls have come
        if first_cancelled:
            calls[0].cancel()  # the call that started the walk: it goes on for the other
        release.set()
        found = await asyncio.gather(*calls, return_exceptions=True)
    if first_cancelled:
        assert isinstance(found[0], asyncio.CancelledError)
    served = [headers for headers in found if isinstance(headers, tuple)]
    assert [[h.name for h in headers] for headers in served] == [["Region"]] * (1 if first_cancelled else 2)
    assert len(pages.asked) == 1


async def test_a_failed_walk_leaves_the_tool_without_annotations() -> None:
    registry = ToolHeaders("up")
    with capture_logs() as logs:
        assert await registry.fetch("alice", "weather", Pages(fail=True)) == ()
    assert [(e["event"], e["upstream"], e["error"]) for e in logs] == [("tools_prefetch_failed", "up", "upstream down")]


async def test_a_walk_stops_after_a_hundred_pages_whatever_the_cursors_say() -> None:
    registry = ToolHeaders("up")
    pages = Pages(*({"tools": [], "nextCursor": "again"} for _ in range(101)))
    assert await registry.fetch("alice", "weather", pages) == ()
    assert len(pages.asked) == 100
