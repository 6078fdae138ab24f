"""A real modern client (mcp==2.3.0, 2026-07-28 mode) through the proxy to real legacy servers.

Upstreams: a legacy-only server built on mcp==1.30.0 (tests/e2e/peers/legacy_server.py) and the
conformance fixture in legacy-only mode. Each run goes through a recording tap, and every
message the proxy sent the client is validated against the 2026-07-28 schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.sdk_drivers import run_modern_client
from tests.support.tap import schema_violations

pytestmark = pytest.mark.e2e

PROFILES: dict[str, dict[str, Any]] = {
    "mcp1-legacy-server": {
        "tools": {"tool": "echo", "arguments": {"text": "hi"}},
        "progress": {"tool": "progress", "arguments": {}, "expect_progress": 3},
        "elicitation": {"tool": "elicit", "arguments": {"message": "who?"}},
        "sampling": {"tool": "sample", "arguments": {"prompt": "hello"}},
        "roots": {"tool": "roots", "arguments": {}},
        "multi": {"tool": "multi", "arguments": {}},
        "logging": {"tool": "log", "arguments": {}, "level": "warning", "expect_logs": 2},
        "list_changed": {"trigger_tool": "add_tool"},
        "subscribe": {"uri": "test://watched", "trigger_tool": "touch"},
        "prompts": {"prompt": "greet", "prompt_arguments": {"name": "alice"}},
        "completion": {"prompt": "greet", "argument": {"name": "name", "value": "al"}},
        "resources": {"uri": "test://static"},
        "cancel": {"tool": "slow", "arguments": {"seconds": 10}, "check_tool": "cancelled_count"},
    },
    "fixture-legacy": {
        "tools": {"tool": "test_simple_text", "arguments": {}},
        "progress": {"tool": "test_tool_with_progress", "arguments": {}, "expect_progress": 3},
        "elicitation": {"tool": "test_elicitation", "arguments": {"message": "who?"}},
        "sampling": {"tool": "test_sampling", "arguments": {"prompt": "hello"}},
        "roots": {"tool": "test_input_required_result_list_roots", "arguments": {}},
        "multi": {
            "tool": "test_input_required_result_multi_round",
            "arguments": {},
            "elicit_content": {"name": "Ada", "color": "blue"},
        },
        "logging": {"tool": "test_tool_with_logging", "arguments": {}, "level": "info", "expect_logs": 3},
        "subscribe": {"uri": "test://watched-resource", "trigger_tool": None},
        "prompts": {"prompt": "test_prompt_with_arguments", "prompt_arguments": {"arg1": "a", "arg2": "b"}},
        "completion": {"prompt": "test_prompt_with_arguments", "argument": {"name": "arg1", "value": "pa"}},
        "resources": {"uri": "test://static-text"},
    },
}
# The same server started by the proxy over stdio. A legacy stdio server holds one session per
# process, so a listen (its own session, its own process) cannot see what another process does:
# the subscription is acknowledged but nothing triggers an update there.
PROFILES["mcp1-legacy-server-stdio"] = {
    **PROFILES["mcp1-legacy-server"],
    "subscribe": {"uri": "test://watched", "trigger_tool": None},
}
PROXIES = {
    "mcp1-legacy-server": "proxy_to_legacy_server",
    "mcp1-legacy-server-stdio": "proxy_to_legacy_server_stdio",
    "fixture-legacy": "proxy_to_fixture_legacy",
}


@pytest.fixture(params=sorted(PROFILES))
def upstream(request: pytest.FixtureRequest) -> str:
    return request.param


@contextmanager
def proxied_runs(
    request: pytest.FixtureRequest,
    upstream: str,
    tap_factory: Callable[[str], AbstractContextManager[tuple[str, Path]]],
) -> Iterator[Callable[..., dict[str, Any]]]:
    """Scenario runs through tap → proxy → `upstream`; then every recorded message is schema-checked."""
    proxy_url = request.getfixturevalue(PROXIES[upstream])
    with tap_factory(proxy_url) as (tap_url, record):

        def run(scenario: str, **overrides: Any) -> dict[str, Any]:
            observed = run_modern_client(tap_url, scenario, {**PROFILES[upstream].get(scenario, {}), **overrides})
            assert "error" not in observed, observed
            return observed

        yield run
    checked, problems = schema_violations(record)
    assert problems == []
    assert checked > 0


@pytest.fixture
def via_proxy(request: pytest.FixtureRequest, upstream: str, tap_factory) -> Iterator[Callable[..., dict[str, Any]]]:
    with proxied_runs(request, upstream, tap_factory) as run:
        yield run


@pytest.fixture
def via_proxy_to_mcp1(request: pytest.FixtureRequest, tap_factory) -> Iterator[Callable[..., dict[str, Any]]]:
    """The mcp 1.30 server only: the fixture emits no list changes to legacy sessions and has no
    tool that reports upstream cancellation."""
    with proxied_runs(request, "mcp1-legacy-server", tap_factory) as run:
        yield run


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block.get("type") == "text"]


def test_discover_is_answered_from_the_legacy_initialize(via_proxy, upstream):
    observed = via_proxy("discover", mode="auto")
    assert observed["connectedVia"] == "server/discover"
    assert observed["supportedVersions"] == ["2026-07-28"]
    assert observed["resultType"] == "complete"
    assert isinstance(observed["ttlMs"], int) and observed["cacheScope"] in ("private", "public")
    assert observed["serverInfo"]["name"] in ("legacy-e2e-server", "peers-conformance-fixture-v2")
    assert "tools" in observed["capabilities"]


def test_tools_are_listed_with_cache_hints_and_called(via_proxy, upstream):
    observed = via_proxy("tools")
    assert PROFILES[upstream]["tools"]["tool"] in observed["tools"]
    assert observed["result"]["resultType"] == "complete"
    assert texts(observed["result"])[0] in ("echo: hi", "This is a simple text response for testing.")
    tools_list = [m for h in observed["http"] if h["rpc"] == "tools/list" for m in h["messages"] if "ttlMs" in m]
    assert tools_list and all(m["cacheScope"] == "private" and m["ttlMs"] == 0 for m in tools_list)


def test_progress_reaches_the_modern_client_under_its_own_token(via_proxy, upstream):
    observed = via_proxy("progress")
    values = [p[0] for p in observed["progress"]]
    assert len(values) == 3 and values == sorted(values)


def test_elicitation_becomes_input_required_and_the_retry_completes_the_same_call(via_proxy, upstream):
    observed = via_proxy("elicitation")
    assert len(observed["elicitations"]) == 1
    text = texts(observed["result"])[0]
    assert "accept" in text and "Ada" in text
    first, retry = observed["rounds"]
    assert first["gotResultType"] == "input_required" and first["gotRequestState"]
    assert retry["rpcId"] != first["rpcId"]
    assert retry["sentInputResponses"] == sorted(first["gotInputRequests"])
    assert retry["sentRequestState"] == first["gotRequestState"]
    assert observed["requestStateEchoedExact"] is True


def test_sampling_becomes_input_required(via_proxy, upstream):
    observed = via_proxy("sampling")
    assert observed["samplings"][0]["messages"][0]["content"]["text"] == "hello"
    assert "sampled-by-client" in texts(observed["result"])[0]


def test_roots_become_input_required(via_proxy, upstream):
    observed = via_proxy("roots")
    assert observed["listRootsCalls"] == 1
    assert "file:///tmp/root-a" in texts(observed["result"])[0]


def test_multi_round_input_completes(via_proxy, upstream):
    observed = via_proxy("multi")
    text = texts(observed["result"])[0]
    if upstream == "fixture-legacy":
        assert observed["callbackTypes"] == ["elicitation", "elicitation"]
        assert text == "Done: name=Ada, color=blue"
    else:
        assert observed["callbackTypes"] == ["elicitation", "sampling"]
        assert text == "multi: name=Ada sample=sampled-by-client"


def test_per_request_log_level_filters_logs(via_proxy, upstream):
    observed = via_proxy("logging")
    levels = [entry[0] for entry in observed["logs"]]
    assert levels == (["info"] * 3 if upstream == "fixture-legacy" else ["warning", "error"])


def test_without_a_log_level_no_logs_arrive(via_proxy, upstream):
    observed = via_proxy("logging", level=None, expect_logs=0)
    assert observed["logs"] == []


def test_list_changes_arrive_on_a_listen_stream(via_proxy_to_mcp1):
    observed = via_proxy_to_mcp1("list_changed")
    assert observed["ack"].get("toolsListChanged") is True
    assert observed["listChangedArrived"] is True
    assert len(observed["toolsAfter"]) == len(observed["toolsBefore"]) + 1


def test_resource_subscriptions_arrive_on_a_listen_stream_and_stop_when_it_closes(via_proxy, upstream):
    observed = via_proxy("subscribe")
    assert observed["ack"].get("resourceSubscriptions") == [PROFILES[upstream]["subscribe"]["uri"]]
    if PROFILES[upstream]["subscribe"]["trigger_tool"] is not None:
        assert observed["updateArrived"] is True
        assert observed["updateAfterResubscribe"] is False


def test_prompts_are_listed_and_rendered(via_proxy, upstream):
    observed = via_proxy("prompts")
    assert observed["messages"][0]["content"]["text"] in ("Hello, alice!", "Prompt with arguments: arg1='a', arg2='b'")


def test_completions_are_forwarded(via_proxy, upstream):
    observed = via_proxy("completion")
    assert observed["values"] == (["paris", "park", "party"] if upstream == "fixture-legacy" else ["alice", "alan"])


def test_resources_are_listed_and_read(via_proxy, upstream):
    observed = via_proxy("resources")
    assert PROFILES[upstream]["resources"]["uri"] in observed["resources"]
    assert observed["contents"][0]["text"]


def test_closing_the_stream_cancels_the_legacy_call(via_proxy_to_mcp1):
    observed = via_proxy_to_mcp1("cancel")
    assert observed["cancelled"] is True
    # the legacy server saw notifications/cancelled for it (one more than before the call)
    assert int(observed["checkText"]) == int(observed["checkBefore"]) + 1
