"""Real clients of both eras through the proxy to a real 2024-11-05 HTTP+SSE server:
@modelcontextprotocol/server-everything in its `sse` mode (GET /sse, POST /message), behind
`--upstream-sse`. The legacy client is mcp==1.30.0 over Streamable HTTP (its session is one SSE
connection upstream); the modern one mcp==2.3.0 in 2026-07-28 mode (translated on pooled SSE
connections). Also: the conformance runner, the stream dropping mid-call, the connection bound.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.conformance import REQUIRED_2025_11_25, REQUIRED_2026_07_28, run_conformance
from tests.support.procs import serving
from tests.support.sdk_drivers import (
    finished,
    legacy_client_argv,
    modern_client_argv,
    run_legacy_client,
    run_modern_client,
    started,
    until_progress,
)

from .conftest import PROXY_LOGS
from .test_conformance import EVERYTHING_2026_SCENARIOS, passed
from .test_modern_client_to_legacy import PROFILES as TO_LEGACY

pytestmark = pytest.mark.e2e

PROFILE: dict[str, dict[str, Any]] = {
    "tools": {"tool": "echo", "arguments": {"message": "hi"}},
    "progress": {"tool": "trigger-long-running-operation", "arguments": {"duration": 1, "steps": 3}},
    "sampling": {"tool": "trigger-sampling-request", "arguments": {"prompt": "hello", "maxTokens": 10}},
    "elicitation": {"tool": "trigger-elicitation-request", "arguments": {}},
    "roots": {"tool": "get-roots-list", "arguments": {}},
    "prompts": {"prompt": "args-prompt", "prompt_arguments": {"city": "Paris", "state": "TX"}},
    "resources": {"uri": "demo://resource/static/document/architecture.md"},
    "logging": {"tool": "toggle-simulated-logging", "arguments": {}, "level": "debug", "expect_logs": 1},
    "completion": {"prompt": "completable-prompt", "argument": {"name": "department", "value": "E"}},
    # Its subscriber updates are per session: the first toggle sends one at once, the second stops them.
    "subscribe": {
        "uri": "demo://resource/static/document/architecture.md",
        "trigger_tool": "toggle-subscriber-updates",
        "trigger_arguments": {},
    },
}
CLIENTS = {"legacy": run_legacy_client, "modern": run_modern_client}


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest) -> str:
    return request.param


def run(
    client: str, url: str, scenario: str, profile: dict[str, Any] | None = None, **overrides: Any
) -> dict[str, Any]:
    """One scenario with server-everything's names (PROFILE), or another server's `profile`."""
    args = {**(PROFILE.get(scenario, {}) if profile is None else profile), **overrides}
    observed = CLIENTS[client](url, scenario, args)
    assert "error" not in observed, observed
    assert observed["_exit"] == 0, observed
    return observed


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block.get("type") == "text"]


def test_tools_are_listed_and_called(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "tools")
    assert "trigger-long-running-operation" in observed["tools"]
    assert texts(observed["result"]) == ["Echo: hi"]
    expected = "2026-07-28" if client == "modern" else "2025-11-25"
    assert observed["protocolVersion"] == expected


def test_a_long_running_call_reports_its_progress(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "progress", expect_progress=3)
    assert [p[0] for p in observed["progress"]] == [1.0, 2.0, 3.0]
    assert "Long running operation completed" in texts(observed["result"])[0]


def test_sampling_reaches_the_client(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "sampling")
    assert observed["samplings"][0]["messages"][0]["content"]["text"].endswith("hello")
    assert "sampled-by-client" in texts(observed["result"])[0]


def test_elicitation_reaches_the_client(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "elicitation")
    assert len(observed["elicitations"]) == 1
    assert observed["result"]["isError"] is False


def test_roots_are_asked_of_the_client(start_proxy: Any, everything_sse: str, client: str):
    # A proxy of its own: server-everything asks an upstream session for its roots once and keeps
    # them, and the shared proxy's pooled session may have been asked already by another test.
    with start_proxy(sse=everything_sse) as url:
        observed = run(client, url, "roots")
    assert observed["listRootsCalls"] >= 1
    assert "file:///tmp/root-a" in texts(observed["result"])[0]


def test_completions_are_answered(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "completion")
    assert observed["values"] == ["Engineering"]


def test_a_legacy_clients_subscription_gets_updates_until_unsubscribed(proxy_to_everything_sse: str):
    """A legacy client's session is one SSE connection: its subscription and the tool that makes
    the server send updates meet in the same upstream session. (A modern client's listen is a
    pooled connection of its own, which the server's per-session updates never reach.)"""
    observed = run("legacy", proxy_to_everything_sse, "subscribe")
    assert observed["subscribeResult"] == {} and observed["unsubscribeResult"] == {}
    assert observed["updateArrived"] is True
    assert observed["updateAfterUnsubscribe"] is False


def test_prompts_are_listed_and_got(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "prompts")
    assert "args-prompt" in observed["prompts"]
    assert observed["messages"][0]["content"]["text"] == "What's weather in Paris, TX?"


def test_resources_are_listed_and_read(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "resources")
    assert PROFILE["resources"]["uri"] in observed["resources"]
    assert observed["contents"] and observed["contents"][0]["uri"] == PROFILE["resources"]["uri"]


def test_logs_reach_the_client_at_its_level(proxy_to_everything_sse: str, client: str):
    observed = run(client, proxy_to_everything_sse, "logging")
    assert observed["logs"], observed
    # server-everything words each simulated message after its level ("Info-level message",
    # "Alert level-message"): the level and the data arrive together, unchanged.
    assert all(str(data).lower().startswith(level) for level, _, data in observed["logs"]), observed["logs"]


def test_conformance_2025_11_25_for_legacy_clients_as_much_as_server_everything_passes_over_http(
    proxy_to_everything_sse: str, everything_http: str, tmp_path: Path
):
    _, direct, _ = run_conformance(everything_http, "2025-11-25", tmp_path / "direct")
    _, proxied, summary = run_conformance(proxy_to_everything_sse, "2025-11-25", tmp_path / "proxied")
    assert len(proxied) == REQUIRED_2025_11_25
    assert passed(direct) <= passed(proxied), summary


def test_conformance_2026_07_28_for_modern_clients_every_scenario_server_everything_has_tools_for(
    proxy_to_everything_sse: str, tmp_path: Path
):
    _, scenarios, summary = run_conformance(proxy_to_everything_sse, "2026-07-28", tmp_path)
    assert len(scenarios) == REQUIRED_2026_07_28
    assert EVERYTHING_2026_SCENARIOS <= passed(scenarios), summary


@pytest.mark.parametrize("client", ["legacy", "modern"])
def test_an_sse_url_given_as_upstream_url_is_detected_at_start(start_proxy: Any, everything_sse: str, client: str):
    with start_proxy(everything_sse) as url:  # --upstream http://.../sse
        observed = run(client, url, "tools")
        log = PROXY_LOGS[url].read_text()
    assert texts(observed["result"]) == ["Echo: hi"]
    assert "upstream_sse_detected" in log


# ---------------------------------------------------------------- the mcp 1.30 server over HTTP+SSE

# What each scenario's comparison reads (the rest names sessions, ids or timing).
OBSERVED = {
    "tools": ("result",),  # and the tool in both lists: others' tests add tools to the shared HTTP server
    "progress": ("progress", "result"),
    "elicitation": ("elicitations", "result"),
    "sampling": ("samplings", "result"),
    "roots": ("listRootsCalls", "result"),
    "multi": ("callbackTypes", "result"),
    "logging": ("logs", "result"),
    "list_changed": ("listChangedArrived",),
    "subscribe": ("subscribeResult", "unsubscribeResult", "updateArrived", "updateAfterUnsubscribe"),
    "prompts": ("prompts", "messages"),
    "completion": ("values",),
    "resources": ("resources", "contents"),
}


@pytest.mark.parametrize("scenario", sorted(OBSERVED))
def test_the_same_server_over_http_sse_serves_what_it_serves_over_streamable_http(
    proxy_to_legacy_server_sse: str, proxy_to_legacy_server: str, client: str, scenario: str
):
    """The mcp 1.30 legacy server, once behind --upstream-sse and once behind --upstream: a client of
    either era observes the same (test_modern_client_to_legacy.py judges the second from first
    principles)."""
    profile = TO_LEGACY["mcp1-legacy-server"][scenario]
    over_sse = run(client, proxy_to_legacy_server_sse, scenario, profile)
    over_http = run(client, proxy_to_legacy_server, scenario, profile)
    compared = OBSERVED[scenario]
    if scenario == "tools":
        assert profile["tool"] in over_sse["tools"] and profile["tool"] in over_http["tools"]
    assert any(over_http.get(key) is not None for key in compared), over_http
    assert {key: over_sse.get(key) for key in compared} == {key: over_http.get(key) for key in compared}


def test_cancellation_reaches_the_server_over_http_sse(proxy_to_legacy_server_sse: str, client: str):
    """A legacy client's notifications/cancelled is relayed on its own connection; a modern
    client's closed POST becomes notifications/cancelled on the pooled one. The server counts."""
    observed = run(client, proxy_to_legacy_server_sse, "cancel", TO_LEGACY["mcp1-legacy-server"]["cancel"])
    if client == "legacy":
        assert observed["checkAfter"] == observed["checkBefore"] + 1
    else:
        assert observed["cancelled"] is True
        assert int(observed["checkText"]) == int(observed["checkBefore"]) + 1


# ---------------------------------------------------------------- faults and bounds


def observed_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("client", ["legacy", "modern"])
def test_the_server_going_away_mid_call_gets_the_client_a_json_rpc_error_not_a_hang(
    start_proxy: Any, logs_dir: Path, client: str
):
    argv = ["bash", str(peers.peer_sh()), "everything-sse", "0"]
    with serving(argv, logs_dir / f"everything-sse-dying-{client}.log") as server:
        with start_proxy(sse=f"http://127.0.0.1:{server.port}/sse") as url:
            make_argv = legacy_client_argv if client == "legacy" else modern_client_argv
            args = {"tool": "trigger-long-running-operation", "arguments": {"duration": 30, "steps": 30}}
            driver = started(make_argv(url, "progress", args, 60.0))
            until_progress(driver, 30.0)  # the call is running, its progress arriving
            server.stop()  # the SSE stream ends with the server
            stopped = time.monotonic()
            observed = finished(driver, 30.0)
            elapsed = time.monotonic() - stopped
    assert elapsed < 10, elapsed  # at once, not at the request timeout
    assert "error" in observed, observed
    text = json.dumps(observed["error"])
    assert "-32010" in text and "lost its SSE stream" in text and "during the request" in text, observed


def test_legacy_sessions_past_the_sse_bound_get_503_while_every_connection_is_busy(
    start_proxy: Any, everything_sse: str
):
    with start_proxy(sse=everything_sse, UPSTREAM__SSE__MAX_SESSIONS="1") as url:
        args = {"tool": "trigger-long-running-operation", "arguments": {"duration": 4, "steps": 4}}
        busy = started(legacy_client_argv(url, "progress", args, 30.0))
        until_progress(busy, 20.0)  # its session holds the one SSE connection, its call running
        refused = run_legacy_client(url, "ping", {}, timeout=10.0)
        observed = finished(busy, 30.0)
        after = run_legacy_client(url, "ping", {}, timeout=10.0)
    assert "error" in refused and "503" in json.dumps(refused), refused
    assert "error" not in observed, observed
    assert "error" not in after, after
