"""Real 2024-11-05 HTTP+SSE clients through the proxy (docs/use/pairings.md, HTTP+SSE clients): the mcp==1.30.0
client's `sse_client` and the TypeScript SDK v1's `SSEClientTransport`, GET /sse and POST to the
endpoint it names, in front of a modern server (mcp 2.3, translated), legacy servers over HTTP and
over stdio (mcp 1.30, relayed) and a 2024-11-05 HTTP+SSE server (server-everything, relayed).

The oracle for each scenario is the same client over Streamable HTTP through the same proxy
(what tests/e2e/test_legacy_client_to_modern.py and test_modern_client_to_legacy.py check from
first principles): an HTTP+SSE client must observe exactly what it observes. Cancellation, the
session ending with its stream and a second stream being a second session are checked directly.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.procs import wait_for
from tests.support.replicas import wait_until
from tests.support.sdk_drivers import run_legacy_client

from .test_legacy_client_to_modern import PROFILES as TO_MODERN
from .test_modern_client_to_legacy import PROFILES as TO_LEGACY
from .test_sse_upstream_e2e import PROFILE as EVERYTHING

pytestmark = pytest.mark.e2e

# Per upstream: the proxy fixture in front of it, and its names per scenario.
UPSTREAMS: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "mcp2-modern-http": ("proxy_to_modern_server", TO_MODERN["mcp2-modern-server"]),
    "mcp1-legacy-http": ("proxy_to_legacy_server", TO_LEGACY["mcp1-legacy-server"]),
    "mcp1-legacy-stdio": ("proxy_to_legacy_server_stdio", TO_LEGACY["mcp1-legacy-server-stdio"]),
    "everything-sse": ("proxy_to_everything_sse", EVERYTHING),
}
# What of a scenario's observations is compared (the rest names sessions, ids or timing).
OBSERVED: dict[str, tuple[str, ...]] = {
    "tools": ("protocolVersion", "tools", "result"),
    "progress": ("progress", "result"),
    "elicitation": ("elicitations", "result"),
    "sampling": ("samplings", "result"),
    "roots": ("listRootsCalls", "result"),
    "multi": ("callbackTypes", "result"),
    "logging": ("setLevelResult", "logs", "result"),
    "list_changed": ("listChangedArrived", "toolsAdded"),
    "subscribe": ("subscribeResult", "unsubscribeResult", "updateArrived", "updateAfterUnsubscribe"),
    "prompts": ("prompts", "messages"),
    "completion": ("values",),
    "resources": ("resources", "contents"),
    "ping": ("pings",),
}
# server-everything's simulated logs come at random levels and name the session: compared by shape.
RANDOM = {("everything-sse", "logging")}


def cases() -> list[Any]:
    return [
        pytest.param(upstream, scenario, id=f"{upstream}-{scenario}")
        for upstream, (_, profile) in UPSTREAMS.items()
        for scenario in OBSERVED
        if scenario in profile or scenario == "ping"
    ]


def sse_url(proxy_url: str) -> str:
    """What the legacy driver takes for "connect over HTTP+SSE" (tests/e2e/peers/legacy_client.py)."""
    return "sse:" + proxy_url.removesuffix("/mcp") + "/sse"


def run(url: str, scenario: str, args: dict[str, Any]) -> dict[str, Any]:
    observed = run_legacy_client(url, scenario, args)
    assert "error" not in observed, observed
    assert observed["_exit"] == 0, observed
    if "toolsAfter" in observed:  # the server's list grows with every run: what this one added
        observed["toolsAdded"] = len(observed["toolsAfter"]) - len(observed["toolsBefore"])
    return observed


@pytest.mark.parametrize(("upstream", "scenario"), cases())
def test_an_sse_client_observes_what_a_streamable_http_client_does(
    request: pytest.FixtureRequest, upstream: str, scenario: str
):
    fixture, profile = UPSTREAMS[upstream]
    proxy_url = request.getfixturevalue(fixture)
    args = profile.get(scenario, {})
    over_http = run(proxy_url, scenario, args)
    over_sse = run(sse_url(proxy_url), scenario, args)
    assert over_sse["sessionId"], "the SDK saw no endpoint event naming a session"
    # One event stream, and every message a POST the proxy accepted (202) for it.
    streams = [h for h in over_sse["http"] if h["method"] == "GET"]
    posts = [h for h in over_sse["http"] if h["method"] == "POST"]
    assert len(streams) == 1 and streams[0]["contentType"].startswith("text/event-stream"), streams
    assert posts and all(h["status"] == 202 for h in posts), posts
    keys = OBSERVED[scenario]
    if (upstream, scenario) in RANDOM:
        assert over_sse["logs"], over_sse
        assert all(str(data).lower().startswith(level) for level, _, data in over_sse["logs"]), over_sse["logs"]
        assert over_sse["result"]["content"][0]["text"].startswith("Started simulated")  # names its session
        keys = ("setLevelResult",)
    compared_sse = {key: over_sse.get(key) for key in keys}
    compared_http = {key: over_http.get(key) for key in keys}
    assert any(value is not None for value in compared_http.values()), compared_http
    assert compared_sse == compared_http


@pytest.mark.parametrize("upstream", ["mcp1-legacy-http", "mcp1-legacy-stdio", "mcp2-modern-http"])
def test_notifications_cancelled_from_an_sse_client_cancels_the_call_upstream(
    request: pytest.FixtureRequest, upstream: str, logs_dir: Path
):
    fixture, profile = UPSTREAMS[upstream]
    proxy_url = request.getfixturevalue(fixture)
    observed = run(sse_url(proxy_url), "cancel", profile["cancel"])
    assert observed["checkAfter"] == observed["checkBefore"] + 1  # the server saw the call cancelled
    if upstream.startswith("mcp1"):
        # ...by notifications/cancelled relayed, not a connection dropped (the mcp 1.30 server
        # tells which; a 2026-07-28 server only ever learns of it by its POST closing).
        logs = [logs_dir / "legacy-server.log", *logs_dir.glob("proxy-*.log")]
        said = f"CANCELLED slow id={observed['cancelledId']} reason=notifications/cancelled"
        # (relayed into the proxy's log, a line lands there a few milliseconds after it is logged)
        assert wait_for(lambda: any(said in path.read_text(errors="replace") for path in logs if path.exists()), 10)


def metric(proxy_url: str, name: str, labels: str) -> float:
    with urllib.request.urlopen(proxy_url.removesuffix("/mcp") + "/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    assert match, f"no {name}{{{labels}}} exported"  # a series under other labels would read as 0
    return float(match.group(1))


def test_the_session_and_its_server_process_end_with_the_stream(start_proxy: Any):
    """A legacy stdio server's process is the session's: gone once the SSE client disconnects."""
    command = " ".join([str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--stdio"])
    with start_proxy(command=command) as proxy_url:
        observed = run(sse_url(proxy_url), "tools", UPSTREAMS["mcp1-legacy-stdio"][1]["tools"])
        assert observed["result"]["content"][0]["text"] == "echo: hi"
        processes = f'upstream="{peers.mcp1_python().name}"'  # named by its program
        wait_until(
            lambda: metric(proxy_url, "mcp_era_proxy_upstream_processes", processes) == 0, 15, "the process stopped"
        )
        assert metric(proxy_url, "mcp_era_proxy_sessions_open", 'downstream_era="legacy"') == 0
        assert metric(proxy_url, "mcp_era_proxy_streams_open", 'kind="downstream_sse"') == 0


# ---------------------------------------------------------------- the TypeScript SDK v1 client

TS_HOST = peers.PEER_SCRIPTS / "ts_host.cjs"
TS_CALLS: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    # (tool, arguments, what its result's text starts with)
    "mcp2-modern-http": [("progress", {}, "progress done"), ("elicit", {"message": "who?"}, "")],
    "mcp1-legacy-http": [("progress", {}, "progress done"), ("elicit", {"message": "who?"}, "")],
    "mcp1-legacy-stdio": [("progress", {}, "progress done"), ("elicit", {"message": "who?"}, "")],
    "everything-sse": [
        ("trigger-long-running-operation", {"duration": 1, "steps": 3}, "Long running operation completed"),
        ("trigger-elicitation-request", {}, ""),
    ],
}


def run_ts(url: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    spec = {"sse_url": url, "tool": tool, "arguments": arguments}
    done = subprocess.run(
        ["node", str(TS_HOST), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        env=peers.node_env(),
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr[-3000:]
    observed: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in observed, observed
    return observed


@pytest.mark.parametrize("upstream", sorted(TS_CALLS))
def test_the_typescript_sdk_sse_client_gets_progress_and_elicitation(request: pytest.FixtureRequest, upstream: str):
    proxy_url = request.getfixturevalue(UPSTREAMS[upstream][0])
    url = proxy_url.removesuffix("/mcp") + "/sse"
    (slow, slow_arguments, slow_text), (elicit, elicit_arguments, _) = TS_CALLS[upstream]
    progressed = run_ts(url, slow, slow_arguments)
    assert slow in progressed["tools"] and elicit in progressed["tools"]
    # In order, from the first step on. The SDK drops a progress notification that arrives after
    # the call's result (server-everything sends its last one a moment before it, so straight
    # against the server too the TypeScript client often sees only [1, 2]).
    progress = progressed["progress"]
    assert progress and progress == list(range(1, len(progress) + 1)) and len(progress) <= 3, progress
    assert progressed["result"]["content"][0]["text"].startswith(slow_text)
    elicited = run_ts(url, elicit, elicit_arguments)
    assert len(elicited["elicitations"]) == 1
    assert elicited["result"].get("isError") is not True
