"""Which requests of a modern client are the tasks extension's, and which tool calls the server runs
as tasks (proxy/relay/tasks/modern_clients.py)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from proxy.errors import ProxyError
from proxy.protocol import jsonrpc
from proxy.protocol import task_extension as te
from proxy.protocol.modern_validate import ModernRequest
from proxy.protocol.versions import LATEST_MODERN
from proxy.relay.channel import Caller
from proxy.relay.tasks.host import LegacyTaskHost
from proxy.relay.tasks.modern_clients import ModernClientTasks, TaskRelay, TaskRoute, TaskTools, task_route

JSONDict = dict[str, Any]
DECLARING: JSONDict = {"extensions": {te.EXTENSION: {}}}
TAKES_TASKS: JSONDict = {"tasks": {"requests": {"tools": {"call": {}}}}}


def request(method: str, params: JSONDict | None = None, capabilities: JSONDict | None = None) -> ModernRequest:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    return ModernRequest(message, method, LATEST_MODERN, capabilities or {}, None, None)


def tool(name: str, support: str | None) -> JSONDict:
    return {"name": name, "inputSchema": {"type": "object"}} | (
        {"execution": {"taskSupport": support}} if support else {}
    )


# ---------------------------------------------------------------- the route of a request


@pytest.mark.parametrize("method", sorted(te.METHODS))
@pytest.mark.parametrize("capabilities", [DECLARING, {}], ids=["declared", "undeclared"])
def test_a_task_method_is_the_extensions_whether_declared_or_not(method: str, capabilities: JSONDict) -> None:
    # An undeclared one is refused there, with the extension it misses.
    assert task_route(request(method, {"taskId": "t"}, capabilities)) is TaskRoute.TASK_METHOD


def test_a_first_tools_call_of_a_declaring_client_may_become_a_task() -> None:
    assert task_route(request("tools/call", {"name": "slow"}, DECLARING)) is TaskRoute.MAY_BECOME_TASK


@pytest.mark.parametrize(
    "plain",
    [
        request("tools/call", {"name": "slow"}),  # no extension declared
        request("tools/call", {"name": "slow"}, {"extensions": {"com.example/other": {}}}),
        request("tools/call", {"name": "slow", "requestState": "s"}, DECLARING),  # a retry of a parked call
        request("resources/read", {"uri": "file:///a"}, DECLARING),  # only tools/call becomes a task
        request("tools/list", None, DECLARING),
    ],
    ids=["undeclared", "other-extension", "retry", "resources-read", "tools-list"],
)
def test_every_other_request_is_served_as_it_is(plain: ModernRequest) -> None:
    assert task_route(plain) is None


class Untouchable:
    """A relay and a host that fail the test when a plain request reaches them."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a plain request reached {name}")


async def test_a_plain_tools_call_is_handed_back_without_touching_the_tasks_or_the_upstream() -> None:
    router = ModernClientTasks(cast(LegacyTaskHost, Untouchable()), TaskTools(), cast(TaskRelay, Untouchable()))
    caller = Caller("alice", {})
    assert await router.take(request("tools/call", {"name": "slow"}), caller) is None
    assert await router.take(request("tools/call", {"name": "slow", "requestState": "s"}, DECLARING), caller) is None


# ---------------------------------------------------------------- which tool calls are tasks


def test_a_required_tool_runs_as_a_task_always_an_optional_one_only_in_a_hosted_task() -> None:
    tools = TaskTools()
    tools.learn_from({"tools": [tool("must", "required"), tool("may", "optional"), tool("plain", None)]})
    assert tools.required == {"must"} and tools.capable == {"must", "may"}
    assert tools.as_task("must", hosted=False) and tools.as_task("must", hosted=True)
    assert not tools.as_task("may", hosted=False) and tools.as_task("may", hosted=True)
    assert not tools.as_task("plain", hosted=True) and not tools.as_task(None, hosted=True)


def test_what_was_learnt_from_one_page_stays_when_another_comes() -> None:
    tools = TaskTools()
    tools.learn_from({"tools": [tool("a", "required")]})
    tools.learn_from({"tools": [tool("b", "optional")]})
    assert tools.required == {"a"} and tools.capable == {"a", "b"}


class ListingSession:
    """A pooled session whose tools/list comes in pages, or fails."""

    def __init__(self, pages: list[JSONDict | Exception], capabilities: JSONDict = TAKES_TASKS) -> None:
        self.pages = pages
        self.server_capabilities = capabilities
        self.asked: list[tuple[str, JSONDict | None]] = []

    async def call(self, method: str, params: JSONDict | None = None, timeout_s: float = 30.0) -> JSONDict:
        self.asked.append((method, params))
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return page


async def test_the_list_is_walked_page_by_page_once() -> None:
    session = ListingSession(
        [{"tools": [tool("a", "required")], "nextCursor": "c2"}, {"tools": [tool("b", "optional")]}]
    )
    tools = TaskTools()
    assert await tools.runs_as_task(cast(Any, session), "up", "a", hosted=False)
    assert session.asked == [("tools/list", None), ("tools/list", {"cursor": "c2"})]
    assert tools.learnt and tools.capable == {"a", "b"}
    assert not await tools.runs_as_task(cast(Any, session), "up", "b", hosted=False)
    assert len(session.asked) == 2  # learnt: not walked again


async def test_a_list_that_fails_is_walked_again_with_the_next_call() -> None:
    refused = ProxyError(jsonrpc.INTERNAL_ERROR, "down")
    session = ListingSession([refused, {"tools": [tool("a", "required")]}])
    tools = TaskTools()
    assert not await tools.runs_as_task(cast(Any, session), "up", "a", hosted=False)
    assert not tools.learnt
    assert await tools.runs_as_task(cast(Any, session), "up", "a", hosted=False)
    assert tools.learnt


async def test_a_server_that_takes_no_tasks_runs_no_call_as_one_and_is_not_listed() -> None:
    session = ListingSession([], capabilities={"tools": {}})
    tools = TaskTools()
    tools.learn_from({"tools": [tool("a", "required")]})
    assert not await tools.runs_as_task(cast(Any, session), "up", "a", hosted=True)
    assert session.asked == [] and not tools.learnt
