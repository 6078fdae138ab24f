"""The real SDK clients as scenario drivers (tests/e2e/peers): the mcp==1.30.0 legacy client, the
mcp==2.3.0 modern client, and that SDK as a client of the tasks extension, each run in its own
virtualenv; used by tests/e2e and tests/replicas."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import peers


def driver_argv(
    python: Path, script: str, url: str, scenario: str, args: dict[str, Any] | None, timeout: float
) -> list[str]:
    """The command line of one scenario of a driver (its own deadline is `timeout`)."""
    return [
        str(python),
        str(peers.PEER_SCRIPTS / script),
        "--url",
        url,
        "--scenario",
        scenario,
        "--timeout",
        str(timeout),
        "--args",
        json.dumps(args or {}),
    ]


def legacy_client_argv(url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> list[str]:
    return driver_argv(peers.mcp1_python(), "legacy_client.py", url, scenario, args, timeout)


def modern_client_argv(url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> list[str]:
    return driver_argv(peers.mcp2_python(), "modern_client.py", url, scenario, args, timeout)


def modern_task_client_argv(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> list[str]:
    return driver_argv(peers.mcp2_python(), "modern_task_client.py", url, scenario, args, timeout)


def observations(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """What a driver printed: its last stdout line (observations or its error), exit status, stderr."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"driver printed nothing (exit {returncode}); stderr:\n{stderr[-3000:]}")
    observed: dict[str, Any] = json.loads(lines[-1])
    observed["_exit"] = returncode
    observed["_stderr"] = stderr[-3000:]
    return observed


def _run(argv: list[str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15, check=False)
    return observations(done.returncode, done.stdout, done.stderr)


def run_legacy_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==1.30.0 driver; returns its observations (or its error)."""
    return _run(legacy_client_argv(url, scenario, args, timeout), timeout)


def run_modern_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==2.3.0 driver (2026-07-28 mode); returns its observations."""
    return _run(modern_client_argv(url, scenario, args, timeout), timeout)


def run_modern_task_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==2.3.0 tasks-extension driver; returns its observations."""
    return _run(modern_task_client_argv(url, scenario, args, timeout), timeout)
