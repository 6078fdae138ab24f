"""The README's first command, run as written: the proxy in front of the example upstream."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from tests.support.procs import free_port, listening

from .conftest import run_legacy_client

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


def test_the_demo_command_serves_a_legacy_client_through_the_proxy(logs_dir: Path) -> None:
    proxy_port, upstream_port = free_port(), free_port()
    env = {"PROXY_LISTEN": f"127.0.0.1:{proxy_port}", "UPSTREAM_PORT": str(upstream_port)}
    with listening(
        ["bash", readme_commands()[0].split()[1]], proxy_port, logs_dir / "demo.log", env=env, cwd=REPO, timeout=240
    ):
        observed = run_legacy_client(
            f"http://127.0.0.1:{proxy_port}/mcp", "tools", {"tool": "echo", "arguments": {"text": "from the README"}}
        )
    assert "error" not in observed, observed
    assert observed["result"]["content"][0]["text"] == "echo: from the README"
    for port in (proxy_port, upstream_port):  # both processes are gone with the demo
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0
