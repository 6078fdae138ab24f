"""The MCP Inspector's command-line mode (@modelcontextprotocol/inspector-cli 1.0.3, a 2025-era
host on the TypeScript SDK v1) as a host of the proxy: each of its one-shot methods (`--method
tools/list`, `tools/call`, `resources/list`, `resources/read`, `resources/templates/list`,
`prompts/list`, `prompts/get`, `logging/setLevel`) through `mcp-era-proxy stdio` (the Inspector
launches it as its stdio server), through the proxy's Streamable HTTP side and through its
2024-11-05 HTTP+SSE side, in front of a modern-only 2026-07-28 HTTP server, a legacy HTTP server,
legacy and dual-era stdio servers the proxy starts itself and a 2024-11-05 HTTP+SSE server. Each
answer is the one the Inspector gets from the same server straight (or, for the modern-only
fixture it cannot speak to, from the same fixture in its dual-era posture). Every process the
Inspector starts is gone once it has exited, checked by PID.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.procs import alive, cmdline, descendants, reap_tagged, serving, tagged, wait_for

pytestmark = pytest.mark.e2e

# Every process of one Inspector run carries this variable (the Inspector gives its environment to
# the server it starts, the proxy to the server it starts): what is left of a run is found by it.
RUN_TAG = "ERA_PROXY_TEST_INSPECTOR_RUN"
TIMEOUT_S = 60

# One-shot methods per server family: the Inspector's arguments after `--method`.
FIXTURE_METHODS: dict[str, list[str]] = {
    "tools/list": ["tools/list"],
    "tools/call": ["tools/call", "--tool-name", "test_simple_text"],
    "tools/call-error": ["tools/call", "--tool-name", "test_error_handling"],
    "tools/call-image": ["tools/call", "--tool-name", "test_image_content"],
    "resources/list": ["resources/list"],
    "resources/read": ["resources/read", "--uri", "test://static-text"],
    "resources/read-template": ["resources/read", "--uri", "test://template/42/data"],
    "resources/templates/list": ["resources/templates/list"],
    "prompts/list": ["prompts/list"],
    "prompts/get": [
        "prompts/get",
        "--prompt-name",
        "test_prompt_with_arguments",
        "--prompt-args",
        "arg1=paris",
        "arg2=x",
    ],
    "logging/setLevel": ["logging/setLevel", "--log-level", "error"],
}
EVERYTHING_METHODS: dict[str, list[str]] = {
    "tools/list": ["tools/list"],
    "tools/call": ["tools/call", "--tool-name", "echo", "--tool-arg", "message=hi"],
    "tools/call-numbers": ["tools/call", "--tool-name", "get-sum", "--tool-arg", "a=2", "b=3"],  # JSON values
    "resources/list": ["resources/list"],
    "resources/read": ["resources/read", "--uri", "demo://resource/static/document/architecture.md"],
    "resources/templates/list": ["resources/templates/list"],
    "prompts/list": ["prompts/list"],
    "prompts/get": ["prompts/get", "--prompt-name", "args-prompt", "--prompt-args", "city=Paris"],
    "logging/setLevel": ["logging/setLevel", "--log-level", "error"],
}
# The member of each result that carries it (MCP result types); a list one must not be empty.
RESULT_KEY = {
    "tools/list": "tools",
    "tools/call": "content",
    "resources/list": "resources",
    "resources/read": "contents",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
    "prompts/get": "messages",
}


def without(value: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k != key}


def peer_command(name: str) -> str:
    return shlex.join(["bash", str(peers.peer_sh()), name])


@dataclass(frozen=True)
class Upstream:
    proxy_args: Callable[[pytest.FixtureRequest], list[str]]  # how `mcp-era-proxy stdio` reaches it
    direct: Callable[[pytest.FixtureRequest], list[str]]  # the Inspector's own target for the reference
    http_proxy: str  # the fixture of the proxy's HTTP side in front of it
    methods: dict[str, list[str]]
    era: str  # the era the proxy speaks to it in (a dual-era server is spoken to in the modern one)


def url_of(fixture: str) -> Callable[[pytest.FixtureRequest], str]:
    return lambda request: str(request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def pristine_fixture_modern(logs_dir: Path) -> Iterator[str]:
    """A modern-only fixture of this module's own: other modules' tests add tools and prompts to the
    shared one at runtime, which the reference below would not list."""
    argv = ["bash", str(peers.peer_sh()), "fixture-modern", "0"]
    with serving(argv, logs_dir / "inspector-fixture-modern.log") as fixture:
        yield f"http://127.0.0.1:{fixture.port}/mcp"


@pytest.fixture(scope="session")
def pristine_fixture_dual(logs_dir: Path) -> Iterator[str]:
    """The reference for it: the same fixture serving both eras, as fresh."""
    argv = ["bash", str(peers.peer_sh()), "fixture-dual", "0"]
    with serving(argv, logs_dir / "inspector-fixture-dual.log") as fixture:
        yield f"http://127.0.0.1:{fixture.port}/mcp"


@pytest.fixture(scope="session")
def proxy_to_pristine_fixture_modern(start_proxy: Any, pristine_fixture_modern: str) -> Iterator[str]:
    with start_proxy(pristine_fixture_modern) as url:
        yield url


UPSTREAMS = {
    # 2026-07-28 only: the Inspector cannot speak to it (test below); the reference is the same
    # fixture serving both eras, which a 2025-era client gets the 2025-era way.
    "fixture-modern": Upstream(
        lambda r: ["--upstream", url_of("pristine_fixture_modern")(r)],
        lambda r: [url_of("pristine_fixture_dual")(r), "--transport", "http"],
        "proxy_to_pristine_fixture_modern",
        FIXTURE_METHODS,
        "modern",
    ),
    "fixture-stdio": Upstream(
        lambda r: ["--upstream-command", peer_command("fixture-stdio")],
        lambda r: shlex.split(peer_command("fixture-stdio")),
        "proxy_to_fixture_stdio",
        FIXTURE_METHODS,
        "modern",
    ),
    "everything-http": Upstream(
        lambda r: ["--upstream", url_of("everything_http")(r)],
        lambda r: [url_of("everything_http")(r), "--transport", "http"],
        "proxy_to_everything_http",
        EVERYTHING_METHODS,
        "legacy",
    ),
    "everything-stdio": Upstream(
        lambda r: ["--upstream-command", peer_command("everything-stdio")],
        lambda r: shlex.split(peer_command("everything-stdio")),
        "proxy_to_everything_stdio",
        EVERYTHING_METHODS,
        "legacy",
    ),
    "everything-sse": Upstream(
        lambda r: ["--upstream-sse", url_of("everything_sse")(r)],
        lambda r: [url_of("everything_sse")(r), "--transport", "sse"],
        "proxy_to_everything_sse",
        EVERYTHING_METHODS,
        "legacy",
    ),
}


def proxy_command() -> list[str]:
    """The console script a host's configuration names (docs/get-started/desktop-hosts.md)."""
    return [str(Path(sys.executable).with_name("mcp-era-proxy")), "stdio"]


# How the Inspector reaches the proxy: it starts `mcp-era-proxy stdio` itself, or it is a client
# of the proxy's Streamable HTTP side, or of its 2024-11-05 HTTP+SSE side (GET /sse, then POSTs).
DOWNSTREAMS: dict[str, Callable[[pytest.FixtureRequest, Upstream, Path], list[str]]] = {
    "stdio": lambda request, upstream, log: [*proxy_command(), "--log-file", str(log), *upstream.proxy_args(request)],
    "http": lambda request, upstream, log: [url_of(upstream.http_proxy)(request), "--transport", "http"],
    "sse": lambda request, upstream, log: [
        url_of(upstream.http_proxy)(request).removesuffix("/mcp") + "/sse",
        "--transport",
        "sse",
    ],
}


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    left: list[str]  # processes of the run alive 10 s after the Inspector exited (then killed)

    def result(self) -> Any:
        assert self.code == 0, self.stderr[-2000:]
        return json.loads(self.stdout)


def inspect(
    target: list[str], method: list[str], *, watch: Callable[[str], None] | None = None, path: str | None = None
) -> Run:
    """One `mcp-inspector-cli --cli TARGET --method ...` run, bounded; `watch(tag)` runs while it
    does. Its working directory is its own build directory: 1.0.3 looks for its package.json
    relative to the working directory (modelcontextprotocol/inspector#1334), and fails elsewhere.
    `path`: a folder put first on its PATH."""
    tag = uuid.uuid4().hex
    argv = [str(peers.inspector_cli()), "--cli", *target, "--method", *method]
    env = {**os.environ, **peers.node_env(), RUN_TAG: tag}
    if path is not None:
        env["PATH"] = f"{path}:{env['PATH']}"
    cwd = peers.peers_home() / "node_modules" / "@modelcontextprotocol" / "inspector-cli" / "build"
    inspector = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        if watch is not None:
            watch(tag)
        stdout, stderr = inspector.communicate(timeout=TIMEOUT_S)
    finally:
        if inspector.poll() is None:
            os.killpg(inspector.pid, signal.SIGKILL)
            inspector.communicate()
        left = reap_tagged(RUN_TAG, tag)
    return Run(inspector.returncode, stdout, stderr, left)


def is_proxy(pid: int) -> bool:
    """`mcp-era-proxy stdio` itself (the Inspector's own processes have it among their arguments)."""
    return cmdline(pid).split()[1:3] == proxy_command()


@pytest.fixture(scope="session")
def direct_results() -> dict[tuple[str, str], Any]:
    """The Inspector's answers straight from each upstream, by (upstream, method): one run each."""
    return {}


def cases() -> list[Any]:
    # One worker per upstream: its reference answers (direct_results) are asked once, not once per
    # worker that meets one of its cases.
    return [
        pytest.param(
            downstream,
            upstream,
            method,
            id=f"{downstream}-{upstream}-{method}",
            marks=pytest.mark.xdist_group(f"inspector-{upstream}"),
        )
        for downstream in DOWNSTREAMS
        for upstream, spec in UPSTREAMS.items()
        for method in spec.methods
    ]


@pytest.mark.parametrize(("downstream", "upstream", "method"), cases())
def test_each_inspector_method_through_the_proxy_answers_as_the_server_does(
    request: pytest.FixtureRequest,
    downstream: str,
    upstream: str,
    method: str,
    direct_results: dict[tuple[str, str], Any],
    logs_dir: Path,
):
    spec = UPSTREAMS[upstream]
    arguments = spec.methods[method]
    log = logs_dir / f"inspector-{downstream}-{upstream}-{method.replace('/', '_')}.log"
    run = inspect(DOWNSTREAMS[downstream](request, spec, log), arguments)
    assert run.left == []  # the proxy the Inspector started, its server, the Inspector itself
    proxied = run.result()
    if (upstream, method) not in direct_results:
        direct_results[upstream, method] = inspect(spec.direct(request), arguments).result()
    expected = direct_results[upstream, method]
    if arguments[0] == "tools/list" and spec.era == "modern":
        # A 2025-11-25 client of a modern upstream is told every tool may run as a task the proxy
        # hosts (docs/use/tasks.md); 2026-07-28 tools have no `execution`.
        mark = {"execution": {"taskSupport": "optional"}}
        expected = {**expected, "tools": [{**without(tool, "execution"), **mark} for tool in expected["tools"]]}
    assert proxied == expected
    if arguments[0] == "logging/setLevel":
        assert proxied == {}
    else:
        assert proxied[RESULT_KEY[arguments[0]]], proxied
    if downstream == "stdio":
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        # It stopped because the Inspector closed its stdin (the spec's shutdown), not on a signal.
        assert [line["reason"] for line in lines if line["event"] == "stdio_stopping"] == ["stdin_closed"]
        eras = {(line.get("downstream_era"), line.get("upstream_era")) for line in lines if line.get("method")}
        assert eras == {("legacy", spec.era)}, eras


def test_the_inspector_alone_cannot_reach_a_modern_only_server(fixture_modern: str):
    """Why it needs the proxy in front of fixture-modern: a 2025-era client's initialize is refused
    with UnsupportedProtocolVersion, naming the one version the server speaks."""
    run = inspect([fixture_modern, "--transport", "http"], ["tools/list"])
    assert run.code != 0
    assert '"code":-32022' in run.stderr and "2026-07-28" in run.stderr, run.stderr


def test_the_proxy_the_inspector_started_and_its_server_are_gone_after_a_long_call(logs_dir: Path):
    """During a three-second call the proxy is a child of the Inspector's, and server-everything
    over stdio a child of the proxy; once the Inspector has its answer and exits, neither PID is
    alive, nor any other process of the run."""
    seen: list[int] = []

    def watch(tag: str) -> None:
        def proxy_and_server() -> list[int]:
            proxies = [pid for pid in tagged(RUN_TAG, tag) if is_proxy(pid)]
            servers = [child for pid in proxies for child in descendants(pid)]
            return proxies + servers if proxies and servers else []

        seen.extend(wait_for(proxy_and_server, 20))

    log = logs_dir / "inspector-long-call.log"
    target = [*proxy_command(), "--log-file", str(log), "--upstream-command", peer_command("everything-stdio")]
    method = ["tools/call", "--tool-name", "trigger-long-running-operation", "--tool-arg", "duration=3", "steps=3"]
    run = inspect(target, method, watch=watch)
    assert len(seen) >= 2, "the proxy and its server were not both seen while the call ran"
    assert run.left == []
    assert not [pid for pid in seen if alive(pid)]
    assert "completed" in json.dumps(run.result())


HOST_ENTRIES = [("README.md", "## In a desktop host"), ("docs/get-started/desktop-hosts.md", "# Desktop hosts")]


@pytest.mark.parametrize(("page", "heading"), HOST_ENTRIES)
def test_the_documented_host_entry_as_the_inspector_reads_it_from_a_config_file(
    page: str, heading: str, fixture_modern: str, tmp_path: Path
):
    """The `mcpServers` entry people paste (README.md's and the desktop hosts page's), as is but for
    the URL, in the Inspector's `--config` file; `mcp-era-proxy` is found on PATH as a host finds it."""
    section = (peers.REPO / page).read_text().split(heading, 1)[1]
    config = json.loads(section.split("```json", 1)[1].split("```", 1)[0])
    ((name, entry),) = config["mcpServers"].items()
    assert entry["args"][:2] == ["stdio", "--upstream"], entry
    entry["args"][2] = fixture_modern
    (tmp_path / "mcp.json").write_text(json.dumps(config))
    target = ["--config", str(tmp_path / "mcp.json"), "--server", name]
    run = inspect(target, FIXTURE_METHODS["tools/call"], path=str(Path(proxy_command()[0]).parent))
    assert run.left == []
    assert run.result()["content"][0]["type"] == "text"
