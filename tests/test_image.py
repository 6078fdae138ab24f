"""The container images, checked without a container engine: the entrypoint's logic
(docker/entrypoint.sh, run by sh with a config path of the test's own), the Dockerfiles' wiring of
it, the pinned requirements installed with --no-deps and checked complete, and the documented
command of the Node.js image giving npx a /tmp it may execute from."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

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


# ---------------------------------------------------------------- the pinned requirements


def requirements_check() -> ModuleType:
    spec = spec_from_file_location("check_requirements", REPO / "scripts" / "check_requirements.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_and_its_emulation_install_the_pins_and_nothing_else() -> None:
    installs = [run for run in instructions(REPO / "Dockerfile", "RUN") if "requirements.txt" in run]
    assert len(installs) == 1 and "install --no-deps -r /tmp/requirements.txt" in installs[0]
    lint = (REPO / "scripts" / "lint-deploy.sh").read_text()
    assert "--no-deps -r docker/requirements.txt" in lint
    assert "scripts/check_requirements.py docker/requirements.txt" in lint


def test_docker_requirements_are_exact_pins() -> None:
    text = (REPO / "docker" / "requirements.txt").read_text()
    pins = dict(line.split("==") for line in text.splitlines() if line and not line.startswith("#"))
    assert pins and requirements_check().problems(text, pins) == []


def test_the_requirements_check_finds_loose_pins_unpinned_and_missing_distributions() -> None:
    check = requirements_check()
    text = "# generated\nPyYAML==6.0.4\ntyping_extensions==4.16.0\naiohttp>=3\nyarl\nredis==8.1.0\n"
    installed = {
        "pyyaml": "6.0.4",  # names compare as PyPI compares them
        "typing-extensions": "4.16.0",
        "aiohttp": "3.14.5",
        "yarl": "1.25.1",
        "propcache": "0.5.4",
        "pip": "25.0",
        "mcp-era-proxy": "0.1.0",
    }
    assert check.problems(text, installed) == [
        "line 4: 'aiohttp>=3' is not an exact pin (name==version)",
        "line 5: 'yarl' is not an exact pin (name==version)",
        "aiohttp 3.14.5 is installed but not pinned",
        "propcache 0.5.4 is installed but not pinned",
        "yarl 1.25.1 is installed but not pinned",
        "redis==8.1.0 is pinned but not installed",
    ]
    assert check.problems("pyyaml==6.0.3\n", {"PyYAML": "6.0.4"}) == ["pyyaml is installed at 6.0.4, pinned at 6.0.3"]


# ---------------------------------------------------------------- the Node.js image's documented command


def test_the_node_images_documented_run_gives_npms_cache_a_tmp_it_may_execute_from() -> None:
    """npx runs a server from npm's cache; Docker's --tmpfs is noexec unless given exec."""
    env = dict(e.split("=", 1) for e in " ".join(instructions(REPO / "docker" / "Dockerfile.node", "ENV")).split())
    assert env["NPM_CONFIG_CACHE"].startswith("/tmp/")
    page = (REPO / "docs" / "operate" / "docker.md").read_text()
    runs = [
        shlex.split(block.replace("\\\n", " "))
        for block in re.findall(r"```bash\n(.*?)```", page, re.S)
        if "docker run" in block and "-node22" in block
    ]
    assert runs
    for argv in runs:
        tmpfs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
        assert [mount for mount in tmpfs if mount.split(":")[0] == "/tmp"] == ["/tmp:exec"], argv
