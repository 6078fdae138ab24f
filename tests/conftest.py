"""Test-wide guards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

# The real upstream peers, shared by tests/e2e and tests/replicas (one of each per session).
pytest_plugins = ("tests.support.peer_fixtures",)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test in which the proxy's own code makes a blocking call on the event loop (file
    or socket I/O, sleeps, subprocess waits): it would stall every other request."""
    with blockbuster_ctx("proxy") as guard:
        yield guard


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The counts of the hostile-input, fault-injection and soak suites, and their defects (failed
    tests of those suites), printed at the end of every run that ran them; the replica suite's
    measurements on one line."""
    from tests.support import tally

    if tally.REPLICAS:
        terminalreporter.section("replicas")
        groups = [g for g in dict.fromkeys((*tally.REPLICA_GROUPS, *sorted(tally.REPLICAS))) if g in tally.REPLICAS]
        line = " | ".join(", ".join(tally.REPLICAS[g]) for g in groups)
        failed = [r.nodeid for r in terminalreporter.stats.get("failed", []) if "tests/replicas/" in r.nodeid]
        terminalreporter.write_line(f"replicas: {line} | failed {len(failed)}")
    if not tally.COUNTS and not tally.NOTES:
        return
    suites = ("tests/hostile/", "test_hostile_proxy.py", "test_faults.py", "test_soak.py")
    failed = [r.nodeid for r in terminalreporter.stats.get("failed", []) if any(s in r.nodeid for s in suites)]
    counts = tally.COUNTS
    terminalreporter.section("hostile input, faults, soak")
    terminalreporter.write_line(
        f"hostile inputs tried: {counts['hostile.core'] + counts['hostile.proxy']} "
        f"(pure core {counts['hostile.core']}, running proxy {counts['hostile.proxy']}); "
        f"faults injected: {counts['faults']}; soak cycles: {counts['soak.cycles']}; defects: {len(failed)}"
    )
    for key in sorted(k for k in counts if k.count(".") == 2):
        terminalreporter.write_line(f"  {key}: {counts[key]}")
    for line in tally.NOTES:
        terminalreporter.write_line(line)
    for nodeid in failed:
        terminalreporter.write_line(f"  defect: {nodeid}")
