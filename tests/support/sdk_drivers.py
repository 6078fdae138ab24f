"""The real SDK clients as scenario drivers (tests/e2e/peers): the mcp==1.30.0 legacy client and the
mcp==2.3.0 modern client, each run in its own virtualenv; used by tests/e2e and tests/replicas."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.support import peers


def run_legacy_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==1.30.0 driver; returns its observations (or its error)."""
    argv = [
        str(peers.mcp1_python()),
        str(peers.PEER_SCRIPTS / "legacy_client.py"),
        "--url",
        url,
        "--scenario",
        scenario,
        "--timeout",
        str(timeout),
        "--args",
        json.dumps(args or {}),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"driver printed nothing (exit {done.returncode}); stderr:\n{done.stderr[-3000:]}")
    observed = json.loads(lines[-1])
    observed["_exit"] = done.returncode
    observed["_stderr"] = done.stderr[-3000:]
    return observed


def run_modern_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==2.3.0 driver (2026-07-28 mode); returns its observations."""
    argv = [
        str(peers.mcp2_python()),
        str(peers.PEER_SCRIPTS / "modern_client.py"),
        "--url",
        url,
        "--scenario",
        scenario,
        "--timeout",
        str(timeout),
        "--args",
        json.dumps(args or {}),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"driver printed nothing (exit {done.returncode}); stderr:\n{done.stderr[-3000:]}")
    observed = json.loads(lines[-1])
    observed["_exit"] = done.returncode
    observed["_stderr"] = done.stderr[-3000:]
    return observed
