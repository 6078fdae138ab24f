"""Real hosts launching `mcp-era-proxy stdio` as their server process (docs/get-started/desktop-hosts.md;
hosts): the mcp==1.30.0 stdio client (a legacy host) and the mcp==2.3.0 client in 2026-07-28 mode
over stdio (a modern host), each against a modern HTTP server, legacy HTTP servers, legacy
stdio servers the proxy starts itself and a 2024-11-05 HTTP+SSE server. And a host killed
mid-call: the proxy and every process it started are gone soon after, checked by PID.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.procs import alive, children_of, cmdline, descendants, wait_for
from tests.support.sdk_drivers import legacy_client_argv, run_legacy_client, run_modern_client

pytestmark = pytest.mark.e2e

HOSTS = {"legacy": run_legacy_client, "modern": run_modern_client}

MCP_SDK = {
    "tools": {"tool": "echo", "arguments": {"text": "hi"}},
    "progress": {"tool": "progress", "arguments": {}, "expect_progress": 3},
    "elicitation": {"tool": "elicit", "arguments": {"message": "who?"}},
    "sampling": {"tool": "sample", "arguments": {"prompt": "hello"}},
    "roots": {"tool": "roots", "arguments": {}},
    "logging": {"tool": "log", "arguments": {}, "level": "warning", "expect_logs": 2},
    "prompts": {"prompt": "greet", "prompt_arguments": {"name": "alice"}},
    "completion": {"prompt": "greet", "argument": {"name": "name", "value": "al"}},
    "resources": {"uri": "test://static"},
    "list_changed": {"trigger_tool": "add_tool"},
    "subscribe": {"uri": "test://watched", "trigger_tool": "touch"},
}
EVERYTHING = {
    "tools": {"tool": "echo", "arguments": {"message": "hi"}},
    "progress": {
        "tool": "trigger-long-running-operation",
        "arguments": {"duration": 1, "steps": 3},
        "expect_progress": 3,
    },
    "elicitation": {"tool": "trigger-elicitation-request", "arguments": {}},
    "prompts": {"prompt": "simple-prompt", "prompt_arguments": {}},
    "resources": {"uri": "demo://resource/static/document/architecture.md"},
}
# Per upstream: how the proxy reaches it (a fixture giving a URL, or a command) and its names.
UPSTREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "mcp2-modern-http": ("modern_server", MCP_SDK),
    "mcp1-legacy-http": ("legacy_server", MCP_SDK),
    "mcp1-legacy-stdio": ("command:mcp1", MCP_SDK),
    "everything-http": ("everything_http", EVERYTHING),
    "everything-stdio": ("command:everything", EVERYTHING),
    "everything-sse": ("sse:everything_sse", EVERYTHING),
}
SCENARIOS = ["tools", "progress", "elicitation", "sampling", "roots", "logging", "prompts", "completion", "resources"]


def upstream_args(request: pytest.FixtureRequest, upstream: str) -> list[str]:
    source = UPSTREAMS[upstream][0]
    if source == "command:mcp1":
        command = shlex.join([str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--stdio"])
        return ["--upstream-command", command]
    if source == "command:everything":
        return ["--upstream-command", shlex.join(["bash", str(peers.peer_sh()), "everything-stdio"])]
    if source.startswith("sse:"):
        return ["--upstream-sse", request.getfixturevalue(source.removeprefix("sse:"))]
    return ["--upstream", request.getfixturevalue(source)]


def stdio_url(proxy_args: list[str], errlog: Path) -> str:
    """What the drivers take for "launch this as your stdio server" (tests/e2e/peers/*_client.py)."""
    spec = {
        "command": sys.executable,
        "args": ["-m", "proxy", "stdio", *proxy_args],
        "env": dict(os.environ),
        "cwd": str(peers.REPO),
        "errlog": str(errlog),
    }
    return "stdio:" + json.dumps(spec)


@pytest.fixture(params=sorted(UPSTREAMS))
def upstream(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(HOSTS))
def host(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def via_stdio(
    request: pytest.FixtureRequest, upstream: str, host: str, logs_dir: Path
) -> Callable[..., dict[str, Any]]:
    url = stdio_url(upstream_args(request, upstream), logs_dir / f"stdio-{host}-{upstream}.log")

    def run(scenario: str, **overrides: Any) -> dict[str, Any]:
        profile = UPSTREAMS[upstream][1]
        assert scenario in profile, f"{upstream} has no {scenario} scenario: cases() leaves that pair out"
        observed = HOSTS[host](url, scenario, {**profile[scenario], **overrides})
        assert "error" not in observed, observed
        assert observed["_exit"] == 0, observed
        return observed

    return run


def separate_processes(upstream: str, host: str) -> bool:
    """A modern host's listen on a legacy stdio server is a server process of its own, which sees
    nothing another process does (docs/get-started/in-front-of-your-server.md, stdio upstreams)."""
    return host == "modern" and upstream == "mcp1-legacy-stdio"


def cases(scenario: str, *, unless: Callable[[str, str], bool] = lambda upstream, host: False) -> list[Any]:
    """The (upstream, host) pairs a scenario runs on: the upstreams that offer it (server-everything
    has no tool for some), every host."""
    return [
        pytest.param(upstream, host, id=f"{host}-{upstream}")
        for upstream in sorted(UPSTREAMS)
        for host in sorted(HOSTS)
        if scenario in UPSTREAMS[upstream][1] and not unless(upstream, host)
    ]


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block.get("type") == "text"]


@pytest.mark.parametrize(("upstream", "host"), cases("tools"))
def test_tools(via_stdio, upstream, host):
    observed = via_stdio("tools")
    assert UPSTREAMS[upstream][1]["tools"]["tool"] in observed["tools"]
    assert texts(observed["result"]) in (["echo: hi"], ["Echo: hi"])
    if host == "modern":
        assert observed["result"]["resultType"] == "complete"
    else:
        assert observed["protocolVersion"] == "2025-11-25"


@pytest.mark.parametrize(("upstream", "host"), cases("progress"))
def test_progress(via_stdio, upstream, host):
    observed = via_stdio("progress")
    values = [p[0] for p in observed["progress"]]
    assert len(values) == 3 and values == sorted(values)


@pytest.mark.parametrize(("upstream", "host"), cases("elicitation"))
def test_elicitation(via_stdio, upstream, host):
    """A legacy host gets a real elicitation/create request on stdout and answers it on stdin; a
    modern host gets input_required and retries with the answer."""
    observed = via_stdio("elicitation")
    assert len(observed["elicitations"]) == 1
    text = " ".join(texts(observed["result"]))
    assert "accept" in text.lower() or "Ada" in text
    if host == "modern":
        rounds = [c for c in observed["callbacks"] if c["type"] == "elicitation"]
        assert len(rounds) == 1


@pytest.mark.parametrize(("upstream", "host"), cases("sampling"))
def test_sampling(via_stdio, upstream, host):
    observed = via_stdio("sampling")
    assert "sampled-by-client" in texts(observed["result"])[0]


@pytest.mark.parametrize(("upstream", "host"), cases("roots"))
def test_roots(via_stdio, upstream, host):
    observed = via_stdio("roots")
    assert observed["listRootsCalls"] == 1
    assert "file:///tmp/root-a" in texts(observed["result"])[0]


@pytest.mark.parametrize(("upstream", "host"), cases("logging"))
def test_logs(via_stdio, upstream, host):
    observed = via_stdio("logging")
    assert [entry[0] for entry in observed["logs"]] == ["warning", "error"]


@pytest.mark.parametrize(("upstream", "host"), cases("prompts"))
def test_prompts(via_stdio, upstream, host):
    observed = via_stdio("prompts")
    assert UPSTREAMS[upstream][1]["prompts"]["prompt"] in observed["prompts"]
    assert observed["messages"][0]["content"]["text"]


@pytest.mark.parametrize(("upstream", "host"), cases("completion"))
def test_completions(via_stdio, upstream, host):
    assert via_stdio("completion")["values"] == ["alice", "alan"]


@pytest.mark.parametrize(("upstream", "host"), cases("list_changed", unless=separate_processes))
def test_list_changes(via_stdio, upstream, host):
    """A legacy host gets them on its session's GET stream, a modern one on its subscriptions/listen."""
    observed = via_stdio("list_changed")
    assert observed["listChangedArrived"] is True
    assert len(observed["toolsAfter"]) == len(observed["toolsBefore"]) + 1


@pytest.mark.parametrize(("upstream", "host"), cases("subscribe"))
def test_resource_subscriptions(via_stdio, upstream, host):
    trigger = None if separate_processes(upstream, host) else "touch"
    observed = via_stdio("subscribe", trigger_tool=trigger)
    if host == "legacy":
        assert observed["subscribeResult"] == {} and observed["unsubscribeResult"] == {}
    else:
        assert observed["ack"].get("resourceSubscriptions") == ["test://watched"]
    if trigger is not None:
        assert observed["updateArrived"] is True


@pytest.mark.parametrize(("upstream", "host"), cases("resources"))
def test_resources(via_stdio, upstream, host):
    observed = via_stdio("resources")
    uri = UPSTREAMS[upstream][1]["resources"]["uri"]
    assert uri in observed["resources"]
    assert observed["contents"][0]["uri"] == uri


# ------------------------------------------------------------ a host killed mid-call


@pytest.mark.parametrize("upstream_name", ["mcp1-legacy-stdio", "mcp2-modern-http"])
def test_a_host_killed_mid_call_leaves_no_process_behind(request, upstream_name, logs_dir):
    proxy_args = upstream_args(request, upstream_name)
    url = stdio_url(proxy_args, logs_dir / f"killed-host-{upstream_name}.log")
    tool = {"tool": "slow", "arguments": {"seconds": 30}}
    argv = legacy_client_argv(url, "tools", tool, timeout=60)
    # The server says when `slow` starts: on its own log (HTTP), or on its stderr, which the proxy
    # logs (stdio).
    server_logs = [logs_dir / f"killed-host-{upstream_name}.log", logs_dir / "modern-server.log"]

    def calls_started() -> int:
        return sum(path.read_text(errors="replace").count("STARTED slow") for path in server_logs if path.exists())

    before = calls_started()
    host = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proxy = wait_for(lambda: [p for p in children_of(host.pid) if "proxy" in cmdline(p)], 20)
        assert proxy, "the host did not start the proxy"
        proxy_pid = proxy[0]
        assert wait_for(lambda: calls_started() > before, 20), "the call never got under way upstream"
        started = descendants(proxy_pid)
        if upstream_name == "mcp1-legacy-stdio":
            assert started, "the session's server process is not the proxy's child"
        os.kill(host.pid, signal.SIGKILL)
        host.wait(10)
        assert wait_for(lambda: not alive(proxy_pid), 15), "the proxy outlived its host"
        left = [pid for pid in started if alive(pid)]
        assert wait_for(lambda: not [pid for pid in started if alive(pid)], 10), f"left behind: {left}"
    finally:
        if host.poll() is None:
            host.kill()


# The call is cancelled at its first progress, when it runs upstream; the deadline only bounds a
# call that never reports one. The driver's default (5 s) can pass before a loaded machine has
# started the bridge, probed a stdio upstream and sent the call: then nothing reaches the server.
CANCEL_AT_PROGRESS = {"tool": "slow", "arguments": {"seconds": 10}, "after": 25}


@pytest.mark.parametrize("upstream_name", ["mcp1-legacy-http", "mcp2-modern-http"])
def test_a_modern_host_cancelling_a_call_cancels_it_upstream(request, upstream_name, logs_dir):
    """The SDK sends notifications/cancelled on stdin; the bridge closes that call's POST, and the
    server behind sees the call cancelled (a legacy one by notifications/cancelled, a modern one
    by its POST closing), counted by its `cancelled_count` tool."""
    url = stdio_url(upstream_args(request, upstream_name), logs_dir / f"stdio-cancel-{upstream_name}.log")
    observed = run_modern_client(url, "cancel", CANCEL_AT_PROGRESS)
    assert "error" not in observed, observed
    assert observed["cancelled"] is True
    assert int(observed["checkText"]) == int(observed["checkBefore"]) + 1


def test_a_modern_hosts_cancellation_reaches_a_legacy_stdio_server_as_notifications_cancelled(request, logs_dir):
    """The call runs on a pooled server process whose count no later call can be sure to read: the
    server's own stderr line, which the proxy logs (upstream_stderr), tells instead."""
    errlog = logs_dir / "stdio-cancel-modern-mcp1-legacy-stdio.log"
    url = stdio_url(upstream_args(request, "mcp1-legacy-stdio"), errlog)
    observed = run_modern_client(url, "cancel", {**CANCEL_AT_PROGRESS, "check_tool": None})
    assert "error" not in observed, observed
    assert observed["cancelled"] is True
    said = "reason=notifications/cancelled"
    assert wait_for(lambda: said in errlog.read_text(errors="replace"), 10), errlog.read_text()[-2000:]


@pytest.mark.parametrize("upstream_name", ["mcp1-legacy-http", "mcp1-legacy-stdio", "mcp2-modern-http"])
def test_a_legacy_host_cancelling_a_call_cancels_it_upstream(request, upstream_name, logs_dir):
    """notifications/cancelled on stdin, naming the running call: relayed to a legacy server on
    the session (its server process, over stdio), translated to closing the POST for a modern one."""
    url = stdio_url(upstream_args(request, upstream_name), logs_dir / f"stdio-cancel-legacy-{upstream_name}.log")
    arguments = {"tool": "slow", "arguments": {"seconds": 10}, "check_tool": "cancelled_count"}
    observed = run_legacy_client(url, "cancel", arguments)
    assert "error" not in observed, observed
    assert observed["checkAfter"] == observed["checkBefore"] + 1


@pytest.mark.parametrize("upstream_name", ["mcp2-modern-http", "mcp1-legacy-stdio"])
def test_a_dual_era_host_probing_with_server_discover_stays_modern(request, upstream_name, logs_dir):
    url = stdio_url(upstream_args(request, upstream_name), logs_dir / f"stdio-discover-{upstream_name}.log")
    observed = run_modern_client(url, "discover", {"mode": "auto"})
    assert "error" not in observed, observed
    assert observed["protocolVersion"] == "2026-07-28"
    assert observed["supportedVersions"] == ["2026-07-28"]


def test_garbage_on_stdin_gets_jsonrpc_errors_on_stdout_and_no_traceback(request, logs_dir):
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    lines = [
        b"hello",
        b"\x00\xff\xfe",
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"',
        b'{"jsonrpc": "2.0", "id": 2}',
        b"[]",
        b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"_meta": envelope}}).encode(),
    ]
    argv = [sys.executable, "-m", "proxy", "stdio", *upstream_args(request, "mcp2-modern-http")]
    with open(logs_dir / "stdio-garbage.log", "wb") as stderr:
        done = subprocess.run(
            argv, input=b"\n".join(lines) + b"\n", stdout=subprocess.PIPE, stderr=stderr, timeout=60, cwd=peers.REPO
        )
    assert done.returncode == 0
    replies = [json.loads(line) for line in done.stdout.splitlines()]  # every line JSON
    errors = [r for r in replies if "error" in r]
    assert [r.get("id") for r in errors] == [None, None, None, 2, None, 3]
    assert [r["error"]["code"] for r in errors][:3] == [-32700, -32700, -32700]
    assert any(r.get("id") == 4 and "tools" in r["result"] for r in replies)
    assert b"Traceback" not in (logs_dir / "stdio-garbage.log").read_bytes()


def test_a_modern_hosts_call_carries_the_mcp_param_headers_the_tool_declares(request, logs_dir):
    """A 2026-07-28 HTTP client mirrors `x-mcp-header` arguments into Mcp-Param-* headers, which the
    server checks against the body; over stdio there are none, so the bridge adds them, from the
    tools/list the host made or, when it made none, one the bridge makes itself."""
    arguments = {"tool": "header_tool", "arguments": {"region": "eu-west-1"}}
    listed = run_modern_client(
        stdio_url(upstream_args(request, "mcp2-modern-http"), logs_dir / "hdr.log"), "tools", arguments
    )
    assert "error" not in listed, listed
    assert listed["result"]["content"][0]["text"] == "region: eu-west-1 header: eu-west-1"
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "header_tool", "arguments": {"region": "ap-south-1"}, "_meta": envelope},
    }
    argv = [sys.executable, "-m", "proxy", "stdio", *upstream_args(request, "mcp2-modern-http")]
    with open(logs_dir / "stdio-unlisted-call.log", "wb") as stderr:
        done = subprocess.run(
            argv,
            input=json.dumps(call).encode() + b"\n",
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=60,
            cwd=peers.REPO,
        )
    [reply] = [json.loads(line) for line in done.stdout.splitlines()]
    assert reply["result"]["content"][0]["text"] == "region: ap-south-1 header: ap-south-1", reply


TS_HOST = peers.PEER_SCRIPTS / "ts_host.cjs"


TS_CASES = [
    ("everything-stdio", "trigger-elicitation-request", {}, "Ada"),
    ("everything-http", "trigger-long-running-operation", {"duration": 1, "steps": 3}, "completed"),
    ("mcp2-modern-http", "elicit", {"message": "who?"}, "Ada"),
    ("mcp2-modern-http", "progress", {}, "progress"),
    ("mcp1-legacy-stdio", "elicit", {"message": "who?"}, "Ada"),
]


@pytest.mark.parametrize("sdk", ["v1", "v2"])
@pytest.mark.parametrize(("upstream_name", "tool", "arguments", "expected"), TS_CASES)
def test_the_typescript_sdk_stdio_clients_as_hosts(request, sdk, upstream_name, tool, arguments, expected, logs_dir):
    """v1 (@modelcontextprotocol/sdk) is a legacy host, v2 (@modelcontextprotocol/client pinned to
    2026-07-28) a modern one: elicitation reaches either as its SDK expects it."""
    log = logs_dir / f"ts-{sdk}-{upstream_name}-{tool}.log"
    spec = {
        "sdk": sdk,
        "command": sys.executable,
        "args": ["-m", "proxy", "stdio", "--log-file", str(log), *upstream_args(request, upstream_name)],
        "cwd": str(peers.REPO),
        "tool": tool,
        "arguments": arguments,
    }
    done = subprocess.run(
        ["node", str(TS_HOST), json.dumps(spec)], capture_output=True, text=True, timeout=90, check=False
    )
    observed = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in observed, observed
    assert tool in observed["tools"]
    assert expected in json.dumps(observed["result"])
    if "elicit" in tool:
        assert len(observed["elicitations"]) == 1
    if "progress" in tool or "long-running" in tool:
        assert observed["progress"]
    era = "modern" if sdk == "v2" else "legacy"
    assert f'"era":"{era}","event":"stdio_client_era"' in log.read_text()
