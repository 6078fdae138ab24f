"""The official conformance runner, through the proxy: the headline check of each direction."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import peers

pytestmark = pytest.mark.e2e

# Scenarios the runner scores for 2025-11-25 (`conformance list --server --requirements 2025-11-25`).
REQUIRED_2025_11_25 = 30


def run_conformance(
    url: str, requirements: str, out: Path, expected_failures: Path | None = None
) -> tuple[int, dict[str, tuple[int, int]], str]:
    argv = [str(peers.conformance_bin()), "server", "--url", url, "--requirements", requirements, "-o", str(out)]
    if expected_failures is not None:
        argv += ["--expected-failures", str(expected_failures)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env={**peers.node_env()}, check=False)
    summary = done.stdout[done.stdout.find("=== SUMMARY ===") :]
    head, _, tail = summary.partition("Not scored")
    unscored = set(re.findall(r"^\s+[✓✗] (\S+) \(", tail, re.MULTILINE))
    scenarios = {
        m[1]: (int(m[2]), int(m[3]))
        for m in re.finditer(r"^[✓✗] (\S+): (\d+) passed, (\d+) failed", head, re.MULTILINE)
        if m[1] not in unscored
    }
    return done.returncode, scenarios, summary


def test_conformance_2025_11_25_passes_through_the_proxy_in_front_of_a_modern_only_server(
    proxy_to_fixture_modern: str, tmp_path: Path
):
    code, scenarios, summary = run_conformance(proxy_to_fixture_modern, "2025-11-25", tmp_path)
    failed = sorted(name for name, (_, fails) in scenarios.items() if fails)
    assert len(scenarios) == REQUIRED_2025_11_25, summary
    assert failed == [], summary
    assert code == 0, summary
    (tmp_path / "counts.json").write_text(json.dumps(scenarios))
