"""Test-wide guards."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx


def pytest_configure(config: pytest.Config) -> None:
    """Children get SIGINT and SIGQUIT as an operator's shell gives them, whoever started the run: a
    suite started in the background of a non-interactive shell (a CI runner, `cmd &`) inherits them
    ignored, every process it starts would too, and a shell script cannot trap a signal ignored on
    entry (the demo's Ctrl-C test then hangs)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


# The real upstream peers, shared by tests/e2e and tests/replicas (one of each per session).
pytest_plugins = ("tests.support.peer_fixtures",)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test in which the proxy's own code makes a blocking call on the event loop (file
    or socket I/O, sleeps, subprocess waits): it would stall every other request."""
    with blockbuster_ctx("proxy") as guard:
        yield guard


# The suite runs under pytest-xdist with --dist loadgroup (pyproject.toml): tests are handed to the
# workers one by one, except those that share a costly set-up, which go to one worker together, in
# order. Such a set-up is a module-scoped fixture of the test's own module (a proxy with special
# settings, a fault-scripted upstream, Phoenix, an OAuth deployment): without the group, each
# worker that runs one of the module's tests would build it, and build it again whenever its next
# test came from another module. Session-scoped fixtures (the peers of tests/support/
# peer_fixtures.py and tests/e2e/conftest.py, a module's reference run) are built once per worker
# that needs them and kept: they need no group, and their tests spread. The replica suite is one
# group: its clusters and redis-server serve all of it, its modules in order.


def _group(item: pytest.Item) -> str | None:
    path = item.nodeid.split("::", 1)[0]
    if path.startswith("tests/replicas/"):
        return "replicas"
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        for definition in definitions:
            if definition.scope in ("module", "class", "package") and definition.baseid == path:
                return path
    return None


# The groups that take minutes, longest first (measured with --durations): handed out before the
# rest (pyproject.toml turns off pytest-xdist's own order, by group size), so that none of them is
# still running alone at the end while the other workers idle. The rest keeps the collection's
# order, which ends with the many short unit tests that even out the workers' last minutes.
FIRST = ("stdio-bridge-2026-07-28", "replicas", "stdio-bridge-2025-11-25", "tests/e2e/test_soak.py")


def _group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = None if _group_of(item) is not None else _group(item)  # a test's own group stands
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    rank = {group: place for place, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(_group_of(item) or "", len(FIRST)))  # stable: the rest in order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """The groups reach the controller as a suffix of the node ids: fail the run at once if they
    do not (a pytest or pytest-xdist release that loses them), rather than run each group's set-up
    on every worker."""
    grouped = [nodeid for nodeid in ids if nodeid.startswith("tests/replicas/")]
    if node.config.getvalue("dist") == "loadgroup" and grouped and not grouped[0].endswith("@replicas"):
        pytest.exit(f"pytest-xdist lost the test groups ({grouped[0]}): see tests/conftest.py", returncode=3)


# Under pytest-xdist the tests run in worker processes and the summary is printed by the
# controller: each worker hands its tally over when it finishes, and the controller adds them up.


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.support import tally

    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker
        output["tally"] = tally.dump()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    from tests.support import tally

    dumped = getattr(node, "workeroutput", {}).get("tally")
    if dumped is not None:
        tally.merge(dumped)


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
