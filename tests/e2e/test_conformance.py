"""The official conformance runner, through the proxy: the headline check of each direction."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import peers

pytestmark = pytest.mark.e2e

# Scenarios the runner scores (`conformance list --server --requirements <revision>`).
REQUIRED_2025_11_25 = 30
REQUIRED_2026_07_28 = 37
EXPECTED_FAILURES_2026_07_28 = Path(__file__).resolve().parents[1] / "conformance-expected-failures-2026-07-28.yml"


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


def test_conformance_2025_11_25_passes_through_the_proxy_in_front_of_a_modern_only_server(
    proxy_to_fixture_modern: str, tmp_path: Path
):
    code, scenarios, summary = run_conformance(proxy_to_fixture_modern, "2025-11-25", tmp_path)
    failed = sorted(name for name, (_, fails) in scenarios.items() if fails)
    assert len(scenarios) == REQUIRED_2025_11_25, summary
    assert failed == [], summary
    assert code == 0, summary
    (tmp_path / "counts.json").write_text(json.dumps(scenarios))


def test_conformance_2026_07_28_passes_through_the_proxy_in_front_of_a_legacy_only_server(
    proxy_to_fixture_legacy: str, tmp_path: Path
):
    code, scenarios, summary = run_conformance(
        proxy_to_fixture_legacy, "2026-07-28", tmp_path, EXPECTED_FAILURES_2026_07_28
    )
    assert len(scenarios) == REQUIRED_2026_07_28, summary
    failed = sorted(name for name, (_, fails) in scenarios.items() if fails)
    # Only the checks listed (with their reasons) in the expected-failures file may fail.
    assert failed == ["input-required-result-basic-elicitation", "input-required-result-capability-check"], summary
    assert code == 0, summary


def test_conformance_2025_11_25_passes_for_legacy_clients_through_the_proxy_in_front_of_a_legacy_server(
    proxy_to_fixture_legacy: str, tmp_path: Path
):
    code, scenarios, summary = run_conformance(proxy_to_fixture_legacy, "2025-11-25", tmp_path)
    assert len(scenarios) == REQUIRED_2025_11_25, summary
    assert sorted(name for name, (_, fails) in scenarios.items() if fails) == [], summary
    assert code == 0, summary


def test_conformance_2026_07_28_passes_for_modern_clients_through_the_proxy_in_front_of_a_modern_server(
    proxy_to_fixture_modern: str, tmp_path: Path
):
    code, scenarios, summary = run_conformance(proxy_to_fixture_modern, "2026-07-28", tmp_path)
    assert len(scenarios) == REQUIRED_2026_07_28, summary
    assert sorted(name for name, (_, fails) in scenarios.items() if fails) == [], summary
    assert code == 0, summary
