"""The official conformance runner (@modelcontextprotocol/conformance, pinned in tests/peers) against
a URL, and how many of the scenarios it scores passed; used by tests/e2e and tests/replicas. Also one
scenario at a time with its per-check results (the tasks-* scenarios, which it does not score)."""

from __future__ import annotations

import functools
import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support import peers

# Scenarios the runner scores (`conformance list --server --requirements <revision>`).
REQUIRED_2025_11_25 = 30
REQUIRED_2026_07_28 = 37
# What the 2026-07-28 run in front of a legacy-only server may fail, with the reasons, for the runner.
EXPECTED_FAILURES_2026_07_28 = Path(__file__).resolve().parents[1] / "conformance-expected-failures-2026-07-28.yml"
# The scenarios of that file: the only ones allowed to fail there (35 / 37).
EXPECTED_FAILED_2026_07_28 = ["input-required-result-basic-elicitation", "input-required-result-capability-check"]
# The tasks-* scenarios (2026-07-28 wire, io.modelcontextprotocol/tasks): what each check should
# report through the proxy in front of the legacy task-tools fixture. Used by
# tests/e2e/test_conformance_tasks.py.
TASKS_EXPECTATIONS_2026_07_28 = Path(__file__).resolve().parents[1] / "conformance-tasks-2026-07-28.yml"


def run_conformance(
    url: str, requirements: str, out: Path, expected_failures: Path | None = None
) -> tuple[int, dict[str, tuple[int, int]], str]:
    argv = [str(peers.conformance_bin()), "server", "--url", url, "--requirements", requirements, "-o", str(out)]
    if expected_failures is not None:
        argv += ["--expected-failures", str(expected_failures)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env={**peers.node_env()}, check=False)
    summary = done.stdout[done.stdout.find("=== SUMMARY ===") :]
    required = required_scenarios(requirements)
    scenarios = {
        m[1]: (int(m[2]), int(m[3]))
        for m in re.finditer(r"^[✓✗] (\S+): (\d+) passed, (\d+) failed", summary, re.MULTILINE)
        if m[1] in required
    }
    return done.returncode, scenarios, summary


@functools.cache
def required_scenarios(requirements: str) -> frozenset[str]:
    """The server scenarios the runner scores for a revision, from `conformance list` (asked once)."""
    argv = [str(peers.conformance_bin()), "list", "--server", "--requirements", requirements]
    listing = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**peers.node_env()}, check=True
    ).stdout
    server_part = listing.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    return frozenset(re.findall(r"^\s+- (\S+)", server_part, re.MULTILINE))


def run_scenario(
    url: str, scenario: str, out: Path, timeout_s: float = 120.0, options: Sequence[str] = ()
) -> tuple[int, list[dict[str, Any]], str]:
    """One server scenario: the runner's exit status, its per-check results (the checks.json it
    writes under `out`) and its per-check lines as printed, colours removed. `options` go to the
    runner as they are (`--spec-version ...`)."""
    argv = [str(peers.conformance_bin()), "server", "--url", url, "--scenario", scenario, "-o", str(out)]
    argv += ["--timeout", str(int(timeout_s * 1000)), *options]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s + 60, env={**peers.node_env()}, check=False
    )
    printed = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    lines = printed[printed.find("Checks:") : printed.find("Test Results:")].strip()
    reports = sorted(out.glob("*/checks.json"))
    if len(reports) != 1:
        raise AssertionError(f"{scenario}: expected one checks.json under {out}, found {reports}:\n{printed[-3000:]}")
    checks: list[dict[str, Any]] = json.loads(reports[0].read_text())
    return done.returncode, checks, lines


def scenarios_named(prefix: str) -> list[str]:
    """Every server scenario of the runner whose name starts with `prefix`, pending ones included."""
    argv = [str(peers.conformance_bin()), "list", "--server"]
    listing = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**peers.node_env()}, check=True
    ).stdout
    server_part = listing.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    return sorted(set(re.findall(rf"^\s+- ({re.escape(prefix)}\S*)", server_part, re.MULTILINE)))


# The runner's client scenarios the proxy is judged by as a 2026-07-28 client (a legacy host plus the
# proxy), OAuth ones aside: those check the `resource` a client asks tokens for, which the proxy
# rewrites to its own URL by design (docs/operate/authorization.md). From `conformance list --client`.
CLIENT_SCENARIOS_2026_07_28 = [
    "tools_call",
    "request-metadata",
    "sep-2322-client-request-state",
    "http-standard-headers",
    "http-custom-headers",
    "http-invalid-tool-headers",
    "json-schema-ref-no-deref",
    "json-schema-2020-12-preservation",
]
# The 2025-11-25 ones a legacy host passes talking to the runner directly (its servers there hand
# out no session id, as stateless legacy servers do).
CLIENT_SCENARIOS_2025_11_25 = ["initialize", "tools_call", "json-schema-2020-12-preservation"]


def run_client_scenario(
    command: str, scenario: str, spec_version: str, out: Path, timeout_s: float = 90.0
) -> list[dict[str, Any]]:
    """One client scenario: the runner serves it and starts `command` with its URL appended; the
    per-check results it wrote (checks.json under `out`)."""
    argv = [str(peers.conformance_bin()), "client", "--command", command, "--scenario", scenario]
    argv += ["--spec-version", spec_version, "-o", str(out), "--timeout", str(int(timeout_s * 1000))]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s + 60, env={**peers.node_env()}, check=False
    )
    reports = sorted(out.glob("*/checks.json"))
    if len(reports) != 1:
        printed = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
        raise AssertionError(f"{scenario}: expected one checks.json under {out}, found {reports}:\n{printed[-3000:]}")
    checks: list[dict[str, Any]] = json.loads(reports[0].read_text())
    return checks


def verdicts(checks: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Each check of a run (its id and name) with its status."""
    return {(c["id"], c["name"]): c["status"] for c in checks}


def not_passed(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks of a run that failed or warned."""
    return [c for c in checks if c["status"] in ("FAILURE", "WARNING")]
