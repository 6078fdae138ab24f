"""The official conformance runner, through the proxy: the headline check of each direction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.conformance import (
    EXPECTED_FAILED_2026_07_28,
    EXPECTED_FAILURES_2026_07_28,
    REQUIRED_2025_11_25,
    REQUIRED_2026_07_28,
    run_conformance,
)

pytestmark = pytest.mark.e2e


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
    assert failed == EXPECTED_FAILED_2026_07_28, summary
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


def passed(scenarios: dict[str, tuple[int, int]]) -> set[str]:
    return {name for name, (_, fails) in scenarios.items() if not fails}


@pytest.mark.parametrize("requirements", ["2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("upstream", ["proxy_to_fixture_dual", "proxy_to_fixture_stdio"])
def test_conformance_passes_in_full_through_the_proxy_to_a_dual_era_upstream(
    request: pytest.FixtureRequest, upstream: str, requirements: str, tmp_path: Path
):
    """fixture-dual over HTTP, and the fixture over stdio started by the proxy: same as direct."""
    code, scenarios, summary = run_conformance(request.getfixturevalue(upstream), requirements, tmp_path)
    assert len(scenarios) == {"2025-11-25": REQUIRED_2025_11_25, "2026-07-28": REQUIRED_2026_07_28}[requirements]
    assert passed(scenarios) == set(scenarios), summary
    assert code == 0, summary


def test_server_everything_over_stdio_passes_at_least_what_it_passes_directly_over_http(
    proxy_to_everything_stdio: str, everything_http: str, tmp_path: Path
):
    _, direct, _ = run_conformance(everything_http, "2025-11-25", tmp_path / "direct")
    _, proxied, summary = run_conformance(proxy_to_everything_stdio, "2025-11-25", tmp_path / "proxied")
    assert len(direct) == REQUIRED_2025_11_25
    assert passed(direct) <= passed(proxied), summary
    assert len(passed(direct)) >= 11  # the published baseline for server-everything


# The 2026-07-28 scenarios whose tools, prompts and resources server-everything has. The rest call
# fixture-only names (test_image_content, test_simple_prompt, test://static-text, ...) and fail on it
# with "not found" whoever serves it.
EVERYTHING_2026_SCENARIOS = {
    "tools-list",
    "tools-call-simple-text",
    "tools-call-error",
    "server-sse-multiple-streams",
    "resources-list",
    "sep-2164-resource-not-found",
    "prompts-list",
    "dns-rebinding-protection",
    "caching",
    "input-required-result-missing-input-response",
    "input-required-result-unsupported-methods",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
}


def test_server_everything_over_stdio_serves_modern_clients_every_scenario_it_has_tools_for(
    proxy_to_everything_stdio: str, tmp_path: Path
):
    _, scenarios, summary = run_conformance(proxy_to_everything_stdio, "2026-07-28", tmp_path)
    assert len(scenarios) == REQUIRED_2026_07_28
    assert EVERYTHING_2026_SCENARIOS <= passed(scenarios), summary
