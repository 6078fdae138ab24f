"""A real legacy client (mcp==1.30.0) through the proxy to real modern-only servers.

Upstreams: a modern-only server built on mcp==2.3.0 (tests/e2e/peers/modern_server.py) and the
conformance fixture in modern-only mode. Each client run goes through a recording tap, and
every message the proxy sent the client is validated against the schema of the revision the
session negotiated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.support.sdk_drivers import run_legacy_client
from tests.support.tap import schema_violations

pytestmark = pytest.mark.e2e

# Per upstream: the names its tools, prompts and resources go by.
PROFILES: dict[str, dict[str, Any]] = {
    "mcp2-modern-server": {
        "tools": {"tool": "echo", "arguments": {"text": "hi"}},
        "progress": {"tool": "progress", "arguments": {}},
        "elicitation": {"tool": "elicit", "arguments": {"message": "who?"}},
        "sampling": {"tool": "sample", "arguments": {"prompt": "hello"}},
        "roots": {"tool": "roots", "arguments": {}},
        "multi": {"tool": "multi", "arguments": {}},
        # The SDK hands notifications to its callback on a task of their own: the driver waits
        # (bounded) for as many as the server sends, or a late one is missed after the result.
        "logging": {"tool": "log", "arguments": {}, "level": "warning", "expect_logs": 2},
        "list_changed": {"trigger_tool": "add_tool"},
        "subscribe": {"uri": "test://watched", "trigger_tool": "touch"},
        "prompts": {"prompt": "greet", "prompt_arguments": {"name": "alice"}},
        "completion": {"prompt": "greet", "argument": {"name": "name", "value": "al"}},
        "resources": {"uri": "test://static"},
        "cancel": {"tool": "slow", "arguments": {"seconds": 10}, "check_tool": "cancelled_count"},
    },
    # The same server, started by the proxy and spoken to over stdio.
    "mcp2-modern-server-stdio": {},
    "fixture-modern": {
        "tools": {"tool": "test_simple_text", "arguments": {}},
        "progress": {"tool": "test_tool_with_progress", "arguments": {}},
        "elicitation": {"tool": "test_elicitation", "arguments": {"message": "who?"}},
        "sampling": {"tool": "test_sampling", "arguments": {"prompt": "hello"}},
        "roots": {"tool": "test_input_required_result_list_roots", "arguments": {}},
        "multi": {"tool": "test_input_required_result_multi_round", "arguments": {}},
        "logging": {"tool": "test_tool_with_logging", "arguments": {}, "level": "info", "expect_logs": 3},
        "list_changed": {"trigger_tool": "test_trigger_tool_change"},
        "subscribe": {"uri": "test://watched-resource", "trigger_tool": None},
        "prompts": {"prompt": "test_prompt_with_arguments", "prompt_arguments": {"arg1": "a", "arg2": "b"}},
        "completion": {"prompt": "test_prompt_with_arguments", "argument": {"name": "arg1", "value": "pa"}},
        "resources": {"uri": "test://static-text"},
    },
}


PROFILES["mcp2-modern-server-stdio"] = PROFILES["mcp2-modern-server"]
PROXIES = {
    "mcp2-modern-server": "proxy_to_modern_server",
    "mcp2-modern-server-stdio": "proxy_to_modern_server_stdio",
    "fixture-modern": "proxy_to_fixture_modern",
}


@pytest.fixture(params=sorted(PROFILES))
def upstream(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def via_proxy(
    request: pytest.FixtureRequest,
    upstream: str,
    tap_factory: Callable[[str], AbstractContextManager[tuple[str, Path]]],
) -> Iterator[Callable[[str], dict[str, Any]]]:
    """Run a scenario through tap → proxy → upstream; afterwards check every message's schema."""
    proxy_url = request.getfixturevalue(PROXIES[upstream])
    with tap_factory(proxy_url) as (tap_url, record):

        def run(scenario: str, **overrides: Any) -> dict[str, Any]:
            args = {**PROFILES[upstream].get(scenario, {}), **overrides}
            observed = run_legacy_client(tap_url, scenario, args)
            assert "error" not in observed, observed
            return observed

        yield run
    checked, problems = schema_violations(record)
    assert problems == []
    assert checked > 0


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block.get("type") == "text"]


def test_initialize_reports_the_upstream_server_and_a_legacy_session(via_proxy, upstream):
    observed = via_proxy("initialize")
    assert observed["protocolVersion"] == "2025-11-25"
    assert observed["sessionId"]
    assert observed["serverInfo"]["name"] in ("modern-e2e-server", "peers-conformance-fixture-v2")
    capabilities = observed["capabilities"]
    assert {"tools", "prompts", "resources"} <= set(capabilities)
    assert capabilities["resources"].get("subscribe") is True
    assert observed["deleteStatus"] == 200


def test_tools_are_listed_and_called(via_proxy, upstream):
    observed = via_proxy("tools")
    assert PROFILES[upstream]["tools"]["tool"] in observed["tools"]
    expected = "This is a simple text response for testing." if upstream == "fixture-modern" else "echo: hi"
    assert texts(observed["result"]) == [expected]
    assert observed["result"]["isError"] is False


def test_progress_notifications_reach_the_client_in_order(via_proxy, upstream):
    observed = via_proxy("progress")
    values = [p[0] for p in observed["progress"]]
    assert values == sorted(values) and len(values) == 3
    assert all(p[2] for p in observed["progress"])  # progress messages survive for 2025-11-25


def test_elicitation_is_asked_of_the_client_and_its_answer_reaches_the_tool(via_proxy, upstream):
    observed = via_proxy("elicitation")
    assert len(observed["elicitations"]) == 1
    assert observed["elicitations"][0]["message"] == "who?"
    text = texts(observed["result"])[0]
    assert "accept" in text and "Ada" in text


def test_declined_elicitation_reaches_the_tool(via_proxy, upstream):
    observed = via_proxy("elicitation", elicit_action="decline")
    assert "decline" in texts(observed["result"])[0]


def test_sampling_is_asked_of_the_client(via_proxy, upstream):
    observed = via_proxy("sampling")
    assert observed["samplings"][0]["messages"][0]["content"]["text"] == "hello"
    assert "sampled-by-client" in texts(observed["result"])[0]


def test_roots_are_asked_of_the_client(via_proxy, upstream):
    observed = via_proxy("roots")
    assert observed["listRootsCalls"] == 1
    text = texts(observed["result"])[0]
    assert "file:///tmp/root-a" in text and "file:///tmp/root-b" in text


def test_multi_round_input_completes(via_proxy, upstream):
    observed = via_proxy("multi")
    assert (
        observed["callbackTypes"] == ["elicitation", "elicitation"]
        if upstream == "fixture-modern"
        else observed["callbackTypes"] == ["elicitation", "sampling"]
    )
    text = texts(observed["result"])[0]
    if upstream == "fixture-modern":
        assert text.startswith("Done: name=") and "color=" in text
    else:
        assert text == "multi: name=Ada sample=sampled-by-client"


def test_log_level_set_by_the_client_filters_log_notifications(via_proxy, upstream):
    observed = via_proxy("logging")
    levels = [entry[0] for entry in observed["logs"]]
    assert observed["setLevelResult"] == {}
    if upstream != "fixture-modern":
        assert levels == ["warning", "error"]  # debug and info were below the session's level
    else:
        assert levels == ["info", "info", "info"]


def test_without_set_level_no_logs_arrive(via_proxy, upstream):
    observed = via_proxy("logging", level="emergency", expect_logs=0)
    assert observed["logs"] == []


def test_tool_list_changes_arrive_on_the_get_stream(via_proxy, upstream):
    observed = via_proxy("list_changed")
    assert observed["listChangedArrived"] is True
    assert len(observed["toolsAfter"]) == len(observed["toolsBefore"]) + 1


def test_resource_subscription_updates_arrive_until_unsubscribed(via_proxy, upstream):
    observed = via_proxy("subscribe")
    assert observed["subscribeResult"] == {}
    assert observed["unsubscribeResult"] == {}
    if PROFILES[upstream]["subscribe"]["trigger_tool"] is not None:
        assert observed["updateArrived"] is True
        assert observed["updateAfterUnsubscribe"] is False


def test_prompts_are_listed_and_rendered(via_proxy, upstream):
    observed = via_proxy("prompts")
    assert PROFILES[upstream]["prompts"]["prompt"] in observed["prompts"]
    text = observed["messages"][0]["content"]["text"]
    assert text in ("Hello, alice!", "Prompt with arguments: arg1='a', arg2='b'")


def test_completions_are_forwarded(via_proxy, upstream):
    observed = via_proxy("completion")
    expected = ["paris", "park", "party"] if upstream == "fixture-modern" else ["alice", "alan"]
    assert observed["values"] == expected


def test_resources_are_listed_and_read(via_proxy, upstream):
    observed = via_proxy("resources")
    uri = PROFILES[upstream]["resources"]["uri"]
    assert uri in observed["resources"]
    assert observed["contents"][0]["uri"] == uri
    assert observed["contents"][0]["text"]


def test_ping_is_answered(via_proxy, upstream):
    assert via_proxy("ping")["pings"] == [{}, {}]


def test_delete_ends_the_session(via_proxy, upstream):
    observed = via_proxy("session_end", probe=True)
    assert observed["deleteStatus"] == 200
    assert observed["probeAfterDelete"]["status"] == 404


def test_notifications_cancelled_ends_the_call_on_the_modern_server(proxy_to_modern_server):
    """The client's notifications/cancelled closes the call's upstream POST, which is how a
    2026-07-28 server learns of it: its `slow` handler is cancelled (counted by the server)."""
    observed = run_legacy_client(proxy_to_modern_server, "cancel", PROFILES["mcp2-modern-server"]["cancel"])
    assert "error" not in observed, observed
    assert observed["checkAfter"] == observed["checkBefore"] + 1


def test_tool_arguments_marked_x_mcp_header_are_mirrored_into_headers(proxy_to_modern_server):
    observed = run_legacy_client(
        proxy_to_modern_server, "tools", {"tool": "header_tool", "arguments": {"region": "eu-west-1"}}
    )
    assert "error" not in observed, observed
    assert texts(observed["result"]) == ["region: eu-west-1 header: eu-west-1"]


def test_a_session_past_its_lifetime_is_gone_for_the_client(start_proxy, modern_server):
    with start_proxy(modern_server, sessions__max_lifetime_s="2") as url:
        observed = run_legacy_client(url, "expiry", {"deadline": 10})
    assert "error" not in observed, observed
    assert observed["pingsBeforeExpiry"] >= 1
    assert observed["expiryError"] is not None and "Session terminated" in observed["expiryError"]
