"""A modern client (the mcp 2.3 SDK in 2026-07-28 mode) calling server-everything's
`simulate-research-query` through the proxy: a 2025-11-25 tool that runs only as a task
(`taskSupport: "required"`). Straight, no 2026-07-28 client can call it; through the proxy the
call is made as a task upstream and its `tasks/result` is the reply, the task's elicitation
included (docs/use/pairings.md, "Modern client, legacy server")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sdk_drivers import run_legacy_client, run_modern_client

pytestmark = pytest.mark.e2e

TOOL = "simulate-research-query"


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block.get("type") == "text"]


def test_the_legacy_client_itself_cannot_call_the_task_only_tool_plainly(everything_http: str):
    # The yardstick: the tool is what this test says it is (a plain call is refused by the server).
    observed = run_legacy_client(everything_http, "tools", {"tool": TOOL, "arguments": {"topic": "tides"}})
    assert observed["_exit"] == 0, observed
    assert observed["result"]["isError"] is True
    assert "requires task augmentation" in texts(observed["result"])[0]


def test_a_modern_client_gets_the_research_report_of_a_task_only_tool(proxy_to_everything_http: str):
    observed = run_modern_client(proxy_to_everything_http, "tools", {"tool": TOOL, "arguments": {"topic": "tides"}})
    assert "error" not in observed and observed["_exit"] == 0, observed
    assert TOOL in observed["tools"]
    assert observed["result"]["isError"] is False
    [report] = texts(observed["result"])
    assert report.startswith("# Research Report: tides")


def test_the_tasks_elicitation_becomes_an_input_round_and_its_answer_shapes_the_report(proxy_to_everything_http: str):
    args = {
        "tool": TOOL,
        "arguments": {"topic": "python", "ambiguous": True},
        "elicit_content": {"interpretation": "snake"},
    }
    observed = run_modern_client(proxy_to_everything_http, "elicitation", args)
    assert "error" not in observed and observed["_exit"] == 0, observed
    [asked] = observed["elicitations"]
    assert "could have multiple interpretations" in asked["message"]
    first, retry = observed["rounds"]  # the call, answered input_required; the retry, complete
    assert (first["gotResultType"], retry["gotResultType"]) == ("input_required", "complete")
    assert observed["requestStateEchoedExact"] is True
    [report] = texts(observed["result"])
    assert report.startswith("# Research Report: python (snake)")
