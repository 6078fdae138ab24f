"""The conformance runner's tasks-* scenarios (2026-07-28 wire, extension io.modelcontextprotocol/tasks)
through the proxy in front of a 2025-11-25-only server whose tools run as legacy tasks
(tests/peers/fixtures/legacy-tasks-fixture.mjs, checked on its own in test_legacy_tasks_fixture.py).
Each scenario runs on its own; every check it reports is compared with the table in
tests/conformance-tasks-2026-07-28.yml (the runner does not score these scenarios, so the table is the
verdict)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ProxyFactory
from tests.support.conformance import TASKS_EXPECTATIONS_2026_07_28, run_scenario, scenarios_named

pytestmark = pytest.mark.e2e

STATUSES = {"SUCCESS", "FAILURE", "WARNING", "SKIPPED", "INFO"}
TABLE: dict[str, dict[str, Any]] = yaml.safe_load(TASKS_EXPECTATIONS_2026_07_28.read_text())["scenarios"]


@pytest.fixture(scope="module")
def proxy_to_legacy_tasks(start_proxy: ProxyFactory, legacy_tasks: str) -> Iterator[str]:
    with start_proxy(legacy_tasks) as url:  # era detected (auto)
        yield url


def mismatches(entry: dict[str, Any], checks: list[dict[str, Any]]) -> list[str]:
    """How the reported checks differ from the table: each check's status against the expected one
    (SUCCESS unless listed), checks the run did not report, checks the table does not name."""
    expected = entry.get("expected") or {}
    reported = {check["id"]: check for check in checks}
    found = []
    for check in checks:
        want = expected.get(check["id"], {}).get("status", "SUCCESS")
        if check["id"] not in entry["checks"]:
            found.append(f"{check['id']}: {check['status']}, not in the table: {check.get('errorMessage', '')}")
        elif check["status"] != want:
            found.append(f"{check['id']}: {check['status']} (want {want}): {check.get('errorMessage', '')}")
    found += [f"{name}: not reported" for name in entry["checks"] if name not in reported]
    return found


def test_the_table_names_every_tasks_scenario_of_the_runner_and_gives_each_exception_a_reason() -> None:
    assert sorted(TABLE) == scenarios_named("tasks-")
    for scenario, entry in TABLE.items():
        assert entry["checks"] and len(set(entry["checks"])) == len(entry["checks"]), scenario
        for name, why in (entry.get("expected") or {}).items():
            assert name in entry["checks"], (scenario, name)
            assert why["status"] in STATUSES - {"SUCCESS"}, (scenario, name)
            reason = why["reason"].strip()
            assert reason and "\n" not in reason, (scenario, name)


def test_mismatches_reads_statuses_missing_and_unknown_checks() -> None:
    entry = {"checks": ["a", "b", "c"], "expected": {"b": {"status": "FAILURE", "reason": "why"}}}
    ok = [{"id": "a", "status": "SUCCESS"}, {"id": "b", "status": "FAILURE"}, {"id": "c", "status": "SUCCESS"}]
    assert mismatches(entry, ok) == []
    bad = [{"id": "a", "status": "WARNING", "errorMessage": "m"}, {"id": "b", "status": "SUCCESS"}]
    bad.append({"id": "x-setup", "status": "FAILURE", "errorMessage": "n"})
    assert mismatches(entry, bad) == [
        "a: WARNING (want SUCCESS): m",
        "b: SUCCESS (want FAILURE): ",
        "x-setup: FAILURE, not in the table: n",
        "c: not reported",
    ]


@pytest.mark.parametrize("scenario", sorted(TABLE))
def test_tasks_scenario_through_the_proxy_in_front_of_a_legacy_task_server(
    proxy_to_legacy_tasks: str, scenario: str, tmp_path: Path
) -> None:
    _, checks, printed = run_scenario(proxy_to_legacy_tasks, scenario, tmp_path)
    assert checks, printed
    entry = TABLE[scenario]
    found = mismatches(entry, checks)
    assert found == [], "\n".join(found) + "\n\n" + printed
