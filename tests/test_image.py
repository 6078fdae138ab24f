"""The container images, checked without a container engine: the entrypoint's logic
(docker/entrypoint.sh, run by sh with a config path of the test's own) and the Dockerfiles' wiring
of it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.procs import proxy_listener, serving

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
IMAGE_CONFIG = "/etc/mcp-era-proxy/config.yaml"
WAIT_S = 30.0


def instructions(dockerfile: Path, keyword: str) -> list[str]:
    """The arguments of every `keyword` instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line.split(None, 1)[1].strip() for line in text.splitlines() if line.startswith(f"{keyword} ")]


# ---------------------------------------------------------------- the entrypoint's logic


@pytest.fixture
def entrypoint(tmp_path: Path) -> Path:
    """docker/entrypoint.sh with the image's config path moved under tmp_path (tmp_path/etc/config.yaml)."""
    text = ENTRYPOINT.read_text()
    assert text.count(f"CONFIG={IMAGE_CONFIG}\n") == 1
    copy = tmp_path / "entrypoint.sh"
    copy.write_text(text.replace(f"CONFIG={IMAGE_CONFIG}\n", f"CONFIG={tmp_path}/etc/config.yaml\n"))
    (tmp_path / "etc").mkdir()
    return copy


def run(entrypoint: Path, *args: str, proxy: Path) -> tuple[int, dict[str, object]]:
    """The entrypoint run by sh with `proxy` as the mcp-era-proxy on PATH: its exit status, and what
    the stand-in saw (its arguments, its pid)."""
    done = subprocess.Popen(
        ["sh", str(entrypoint), *args],
        stdout=subprocess.PIPE,
        env={"PATH": f"{proxy.parent}:/usr/bin:/bin"},
    )
    out, _ = done.communicate(timeout=WAIT_S)
    seen = json.loads(out)
    assert isinstance(seen, dict)
    seen["entrypoint_pid"] = done.pid
    return done.returncode, seen


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """An mcp-era-proxy that prints its arguments and its pid as JSON, and exits 7."""
    path = tmp_path / "bin" / "mcp-era-proxy"
    path.parent.mkdir()
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "print(json.dumps({'args': sys.argv[1:], 'pid': os.getpid()}))\n"
        "sys.exit(7)\n"
    )
    path.chmod(0o755)
    return path


def test_without_arguments_or_a_config_file_the_proxy_gets_no_arguments(entrypoint: Path, stand_in: Path) -> None:
    status, seen = run(entrypoint, proxy=stand_in)
    assert seen["args"] == []
    assert status == 7 and seen["pid"] == seen["entrypoint_pid"]  # exec'd: signals reach the proxy itself


def test_without_arguments_a_mounted_config_file_is_read(entrypoint: Path, stand_in: Path) -> None:
    config = entrypoint.parent / "etc" / "config.yaml"
    config.write_text("listen: 0.0.0.0:8080\n")
    assert run(entrypoint, proxy=stand_in)[1]["args"] == ["--config", str(config)]


def test_a_directory_where_the_config_file_should_be_is_the_proxys_to_refuse(entrypoint: Path, stand_in: Path) -> None:
    """`docker run -v missing.yaml:...` mounts a directory Docker made: the proxy says it is no file."""
    config = entrypoint.parent / "etc" / "config.yaml"
    config.mkdir()
    assert run(entrypoint, proxy=stand_in)[1]["args"] == ["--config", str(config)]


def test_arguments_are_the_proxys_command_line_as_given(entrypoint: Path, stand_in: Path) -> None:
    (entrypoint.parent / "etc" / "config.yaml").write_text("listen: 0.0.0.0:8080\n")
    args = ["--upstream", "http://upstream:3000/mcp", "--upstream-command", "npx -y server stdio"]
    assert run(entrypoint, *args, proxy=stand_in)[1]["args"] == args


def test_the_proxy_starts_from_its_environment_alone(entrypoint: Path, tmp_path: Path) -> None:
    """What the image does given neither a file nor arguments: the real proxy, configured by
    MCP_ERA_PROXY_* variables only, listens and answers (it used to exit 2: no config file)."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MCP_ERA_PROXY_UPSTREAM__URL": "http://127.0.0.1:9/mcp",
        "MCP_ERA_PROXY_LISTEN": "127.0.0.1:0",
    }
    with serving(["sh", str(entrypoint)], tmp_path / "proxy.log", announced=proxy_listener(), env=env) as proxy:
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}/healthz", timeout=WAIT_S) as reply:
            assert reply.status == 200
    assert "config file not found" not in proxy.output()


# ---------------------------------------------------------------- the Dockerfiles


def test_both_images_start_through_the_entrypoint_with_no_default_arguments() -> None:
    dockerfile, node = REPO / "Dockerfile", REPO / "docker" / "Dockerfile.node"
    assert "docker/entrypoint.sh /usr/local/bin/docker-entrypoint.sh" in instructions(dockerfile, "COPY")
    assert [json.loads(e) for e in instructions(dockerfile, "ENTRYPOINT")] == [["docker-entrypoint.sh"]]
    assert [json.loads(e) for e in instructions(node, "ENTRYPOINT")] == [["tini", "--", "docker-entrypoint.sh"]]
    assert instructions(dockerfile, "CMD")[-1] == "[]" and instructions(node, "CMD") == ["[]"]
    assert os.access(ENTRYPOINT, os.X_OK)  # COPY keeps the mode
    assert "!docker/entrypoint.sh" in (REPO / ".dockerignore").read_text().splitlines()  # in the build context
