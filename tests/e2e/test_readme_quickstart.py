"""The README's first command, run as written: the proxy in front of the example upstream."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.procs import PortTaken, Process, reserved_port
from tests.support.sdk_drivers import finished, legacy_client_argv, run_legacy_client, started, until_progress

from .test_stdio_supervision import alive, descendants

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    quick_start = REPO.joinpath("README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quick_start, re.DOTALL)
    assert block, "README quick start has no bash block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def test_readme_quick_start_has_exactly_the_two_commands_and_ci_runs_the_second() -> None:
    assert readme_commands() == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "scripts/test.sh" in REPO.joinpath(".ci", "run").read_text()


@contextmanager
def demo(log: Path) -> Iterator[tuple[Process, int, int]]:
    """The demo, as the README runs it, on ports of its own (reserved ones: it is told them), until
    the block ends: (its process, the proxy's port, the example upstream's)."""
    for attempt in range(5):
        proxy_port, upstream_port = reserved_port(), reserved_port()
        env = {"PROXY_LISTEN": f"127.0.0.1:{proxy_port}", "UPSTREAM_PORT": str(upstream_port)}
        process = Process(demo_argv(), log.with_suffix(f".{attempt}.log"), env, REPO)
        try:
            process.wait_listening(240, port=proxy_port)
            break
        except PortTaken:
            process.stop()
            if attempt == 4:
                raise
    try:
        yield process, proxy_port, upstream_port
    finally:
        process.stop()


def test_the_demo_command_serves_a_legacy_client_through_the_proxy(logs_dir: Path) -> None:
    with demo(logs_dir / "demo.log") as (_, proxy_port, upstream_port):
        observed = run_legacy_client(
            f"http://127.0.0.1:{proxy_port}/mcp", "tools", {"tool": "echo", "arguments": {"text": "from the README"}}
        )
    assert "error" not in observed, observed
    assert observed["result"]["content"][0]["text"] == "echo: from the README"
    for port in (proxy_port, upstream_port):  # both processes are gone with the demo
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0


def demo_argv() -> list[str]:
    return ["bash", readme_commands()[0].split()[1]]


@pytest.mark.parametrize("taken", ["upstream", "proxy"])
def test_the_demo_refuses_a_port_something_else_listens_on(logs_dir: Path, taken: str) -> None:
    """The example upstream's: it failed to bind (in its log only) and the proxy started in front
    of whatever listened there. The proxy's: the demo printed "Ready. Point an MCP client ... at"
    that address, where the other program answered, and the proxy then failed with cannot_start."""
    free = reserved_port()
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        proxy_port, upstream_port = (free, port) if taken == "upstream" else (port, free)
        env = {"PROXY_LISTEN": f"127.0.0.1:{proxy_port}", "UPSTREAM_PORT": str(upstream_port)}
        demo = Process(demo_argv(), logs_dir / f"demo-{taken}-port-taken.log", env, REPO)
        try:
            code = demo.proc.wait(timeout=100)
        finally:
            demo.stop()  # its whole process group, whatever it started
    output = demo.output()
    assert code == 1, output
    assert f"127.0.0.1:{port} is already in use" in output
    assert ("--upstream-port PORT" if taken == "upstream" else "--listen HOST:PORT") in output
    assert "Ready" not in output and "listening" not in output  # the proxy was never started
    with socket.socket() as sock:  # nor the example upstream, when the proxy's port was taken
        assert sock.connect_ex(("127.0.0.1", free)) != 0


def test_the_demo_is_ready_only_once_the_proxy_itself_listens(logs_dir: Path) -> None:
    """Another program takes the proxy's port after the demo checked it, while the example
    upstream starts: the proxy cannot start, and the demo says so instead of "Ready" (it took the
    port answering for the proxy's readiness)."""
    proxy_port, upstream_port = reserved_port(), reserved_port()
    env = {"PROXY_LISTEN": f"127.0.0.1:{proxy_port}", "UPSTREAM_PORT": str(upstream_port)}
    demo = Process(demo_argv(), logs_dir / "demo-proxy-port-taken-late.log", env, REPO)
    with socket.socket() as foreign:
        try:
            demo.wait_listening(240, port=upstream_port)  # the proxy starts once its upstream listens
            foreign.bind(("127.0.0.1", proxy_port))
            foreign.listen()
            code = demo.proc.wait(timeout=60)
        finally:
            demo.stop()
    output = demo.output()
    assert code == 1, output
    assert "Ready" not in output, output
    assert "cannot_start" in output and f"address=127.0.0.1:{proxy_port}" in output
    assert "demo: the proxy did not start (exit 1)" in output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_demo_script_stops_the_proxy_and_the_example_upstream(
    logs_dir: Path, signum: signal.Signals
) -> None:
    children: set[int] = set()
    try:
        with demo(logs_dir / f"demo-{signum.name}.log") as (script, proxy_port, upstream_port):
            children = descendants(script.proc.pid)
            assert len(children) >= 2, children  # the example upstream and the proxy
            script.proc.send_signal(signum)  # the script alone, as a supervisor or `kill PID` does
            assert script.proc.wait(timeout=60) == 128 + signum
        assert not {pid for pid in children if alive(pid)}, script.output()
        for port in (proxy_port, upstream_port):
            with socket.socket() as sock:
                assert sock.connect_ex(("127.0.0.1", port)) != 0
    finally:
        for pid in children:  # failed: leave no orphan behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_terminals_ctrl_c_with_a_call_in_flight_ends_the_demo_cleanly(logs_dir: Path) -> None:
    """Ctrl-C in a terminal is SIGINT to the whole foreground group: the example server printed a
    50-line traceback, and the client's call was cut without an answer. Now the server is outside
    that group (stopped by the script), the client gets the proxy's shutdown error, and the URL to
    use was printed plainly."""
    with demo(logs_dir / "demo-ctrl-c.log") as (script, proxy_port, _):
        driver = started(
            legacy_client_argv(
                f"http://127.0.0.1:{proxy_port}/mcp", "progress", {"tool": "slow", "arguments": {"seconds": 30}}, 60.0
            )
        )
        until_progress(driver, 30.0)
        os.killpg(script.proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the script's whole group
        assert script.proc.wait(timeout=60) == 130
        observed = finished(driver, 30.0)
        output = script.output()
    assert "Traceback" not in output, output[-3000:]
    assert f"Ready. Point an MCP client (legacy or 2026-07-28) at:  http://127.0.0.1:{proxy_port}/mcp" in output
    assert "READY http" not in output  # the example server's own line, with the wrong URL
    assert "-32014" in json.dumps(observed.get("error")), observed
