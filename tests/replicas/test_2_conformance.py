"""The official conformance runner through three replicas in strict round-robin: the same figures
as through one replica (tests/e2e/test_conformance.py), 30 / 30 for 2025-11-25 clients in front of
the modern-only fixture and 35 / 37 for 2026-07-28 clients in front of the legacy-only fixture (the
two checks of the expected-failures file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import tally
from tests.support.conformance import (
    EXPECTED_FAILED_2026_07_28,
    EXPECTED_FAILURES_2026_07_28,
    REQUIRED_2025_11_25,
    REQUIRED_2026_07_28,
    run_conformance,
)

from .conftest import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.replicas, pytest.mark.timeout(300)]


def failed(scenarios: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(name for name, (_, fails) in scenarios.items() if fails)


def test_conformance_2025_11_25_through_three_replicas_in_front_of_a_modern_only_server(
    make_cluster: ClusterFactory, fixture_modern: str, tmp_path: Path
):
    with make_cluster(fixture_modern, "conformance-l2m") as cluster:
        code, scenarios, summary = run_conformance(cluster.url, "2025-11-25", tmp_path)
    passed = len(scenarios) - len(failed(scenarios))
    tally.replicas("conformance", f"conformance 2025-11-25 {passed}/{len(scenarios)}", append=True)
    assert len(scenarios) == REQUIRED_2025_11_25, summary
    assert failed(scenarios) == [], summary
    assert code == 0, summary


def test_conformance_2026_07_28_through_three_replicas_in_front_of_a_legacy_only_server(
    make_cluster: ClusterFactory, fixture_legacy: str, tmp_path: Path
):
    with make_cluster(fixture_legacy, "conformance-m2l") as cluster:
        code, scenarios, summary = run_conformance(cluster.url, "2026-07-28", tmp_path, EXPECTED_FAILURES_2026_07_28)
    passed = len(scenarios) - len(failed(scenarios))
    tally.replicas("conformance", f"2026-07-28 {passed}/{len(scenarios)}", append=True)
    assert len(scenarios) == REQUIRED_2026_07_28, summary
    assert failed(scenarios) == EXPECTED_FAILED_2026_07_28, summary
    assert code == 0, summary
