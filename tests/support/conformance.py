"""The official conformance runner (@modelcontextprotocol/conformance, pinned in tests/peers) against
a URL, and how many of the scenarios it scores passed; used by tests/e2e and tests/replicas."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support import peers

# Scenarios the runner scores (`conformance list --server --requirements <revision>`).
REQUIRED_2025_11_25 = 30
REQUIRED_2026_07_28 = 37
# What the 2026-07-28 run in front of a legacy-only server may fail, with the reasons, for the runner.
EXPECTED_FAILURES_2026_07_28 = Path(__file__).resolve().parents[1] / "conformance-expected-failures-2026-07-28.yml"
# The scenarios of that file: the only ones allowed to fail there (35 / 37).
EXPECTED_FAILED_2026_07_28 = ["input-required-result-basic-elicitation", "input-required-result-capability-check"]


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


def required_scenarios(requirements: str) -> set[str]:
    """The server scenarios the runner scores for a revision, from `conformance list`."""
    argv = [str(peers.conformance_bin()), "list", "--server", "--requirements", requirements]
    listing = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**peers.node_env()}, check=True
    ).stdout
    server_part = listing.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    return set(re.findall(r"^\s+- (\S+)", server_part, re.MULTILINE))
