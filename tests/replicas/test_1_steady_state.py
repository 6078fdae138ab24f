"""Steady state through three replicas in strict round-robin: the real SDK clients' full scenarios,
and where their requests went.

R1: every check tests/e2e runs with the mcp==1.30.0 legacy client against the mcp==2.3.0 modern-only
server (test_legacy_client_to_modern.py) and with the mcp==2.3.0 modern client against the
mcp==1.30.0 legacy server (test_modern_client_to_legacy.py) is run, with the same assertions, through
the balancer, RUNS times each. With round-robin of every request, each session's requests (and each
answer to an input request) land on every replica in turn.
R0: each replica served at most 40 % of the requests, and requests were forwarded to the replica
holding a live object (a parked call resumed, an answer delivered): the runs passed because
forwarding works, not because requests happened to land on the right replica.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.e2e import test_legacy_client_to_modern as legacy_client_checks
from tests.e2e import test_modern_client_to_legacy as modern_client_checks
from tests.support import tally
from tests.support.replicas import FORWARDS, Cluster
from tests.support.sdk_drivers import run_legacy_client, run_modern_client

from .conftest import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.replicas, pytest.mark.timeout(480)]

RUNS = 3
WORKERS = 3  # SDK client processes at once (2 cores: each spends most of its time starting up)
MAX_SHARE = 0.40
SCENARIO_S = 15.0  # one scenario's deadline (the SDK driver's own): a few seconds when it passes
# The tests/e2e checks that need a proxy of their own (other settings), not a steady-state scenario.
NOT_STEADY = {
    "test_a_session_past_its_lifetime_is_gone_for_the_client",
    # A legacy client's notifications/cancelled is served where it lands: the call it names runs on
    # another replica two times in three here, and is not cancelled there (docs/operate/replicas.md).
    "test_notifications_cancelled_ends_the_call_on_the_modern_server",
}
# How each check's fixtures are given: the scenario runner, the upstream's profile name, the URL.
FIXTURES = {"via_proxy", "via_proxy_to_mcp1", "upstream", "proxy_to_modern_server", "proxy_to_legacy_server"}


@dataclass
class Client:
    name: str  # "legacy" or "modern"
    module: ModuleType  # the tests/e2e checks
    upstream: str  # the profile of the upstream in that module
    driver: Callable[[str, str, dict[str, Any] | None, float], dict[str, Any]]

    def checks(self) -> dict[str, Callable[..., None]]:
        found = {}
        for name, check in vars(self.module).items():
            if not name.startswith("test_") or name in NOT_STEADY or not callable(check):
                continue
            wanted = set(inspect.signature(check).parameters)
            assert wanted <= FIXTURES, f"{name} needs {wanted - FIXTURES}: give it here or list it in NOT_STEADY"
            found[name] = check
        return found

    def run_check(self, check: Callable[..., None], url: str) -> str | None:
        """One check of tests/e2e through `url`; None if it passed, else why it failed."""

        def scenario(name: str, **overrides: Any) -> dict[str, Any]:
            args = {**self.module.PROFILES[self.upstream].get(name, {}), **overrides}
            observed = self.driver(url, name, args, SCENARIO_S)
            assert "error" not in observed, {k: v for k, v in observed.items() if k != "http"}
            return observed

        given: dict[str, Any] = {"via_proxy": scenario, "via_proxy_to_mcp1": scenario, "upstream": self.upstream}
        given |= {"proxy_to_modern_server": url, "proxy_to_legacy_server": url}
        wanted = inspect.signature(check).parameters
        try:
            check(**{name: given[name] for name in wanted})
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
        return None


LEGACY = Client("legacy", legacy_client_checks, "mcp2-modern-server", run_legacy_client)
MODERN = Client("modern", modern_client_checks, "mcp1-legacy-server", run_modern_client)


@dataclass
class Steady:
    # (client, run) -> check name -> None (passed) or why it failed
    outcomes: dict[tuple[str, int], dict[str, str | None]] = field(default_factory=dict)
    # cluster -> replica -> requests it handled, after the runs
    requests: dict[str, dict[str, float]] = field(default_factory=dict)
    forwards: dict[str, float] = field(default_factory=dict)  # kind -> forwards over every replica
    seconds: float = 0.0

    def passed(self, client: str, run: int) -> int:
        return sum(why is None for why in self.outcomes[(client, run)].values())


@pytest.fixture(scope="module")
def steady(
    make_cluster: ClusterFactory, modern_server: str, legacy_server: str, replica_logs: Path
) -> Iterator[Steady]:
    """Both clients' full scenarios, RUNS times, through their balancers (in parallel, bounded);
    then what each replica's /metrics says."""
    result = Steady()
    with make_cluster(modern_server, "steady-l2m") as l2m, make_cluster(legacy_server, "steady-m2l") as m2l:
        clusters: dict[str, Cluster] = {"legacy-to-modern": l2m, "modern-to-legacy": m2l}
        started = time.monotonic()
        jobs = [
            (client, run, name, check, cluster.url)
            for run in range(RUNS)
            for client, cluster in ((LEGACY, l2m), (MODERN, m2l))
            for name, check in client.checks().items()
        ]
        with ThreadPoolExecutor(WORKERS) as pool:
            futures = [(c, run, name, pool.submit(c.run_check, check, url)) for c, run, name, check, url in jobs]
            for client, run, name, future in futures:
                result.outcomes.setdefault((client.name, run), {})[name] = future.result()
        result.seconds = time.monotonic() - started
        outcomes = {f"{client} run {run}": checks for (client, run), checks in result.outcomes.items()}
        (replica_logs / "steady-outcomes.json").write_text(json.dumps(outcomes, indent=1))
        for label, cluster in clusters.items():
            # What the balancer sent each replica: a request forwarded from one replica to another
            # counts in both replicas' own request metrics.
            result.requests[label] = cluster.balancer.requests_sent()
        for kind in ("resume", "deliver"):
            result.forwards[kind] = sum(sum(c.metric(FORWARDS, kind=kind).values()) for c in clusters.values())
    for client in (LEGACY, MODERN):
        runs = ",".join(str(result.passed(client.name, run)) for run in range(RUNS))
        label = "steady legacy" if client is LEGACY else "modern"
        tally.replicas("steady", f"{label} {runs}/{len(client.checks())}", append=True)
    yield result


def failures(steady: Steady, client: str, run: int) -> str:
    """The failed checks of one run, one a line (empty if none failed)."""
    return "\n".join(f"{name}: {why}" for name, why in steady.outcomes[(client, run)].items() if why is not None)


@pytest.mark.parametrize("run", range(RUNS))
def test_the_legacy_client_passes_every_scenario_through_three_replicas(steady: Steady, run: int):
    """mcp 1.30 → modern-only mcp2 server: sessions, input requests answered on any replica, the GET
    stream on one replica while the calls land on the others."""
    failed = failures(steady, "legacy", run)
    assert not failed, f"{steady.passed('legacy', run)} passed; failed:\n{failed}"


@pytest.mark.parametrize("run", range(RUNS))
def test_the_modern_client_passes_every_scenario_through_three_replicas(steady: Steady, run: int):
    """mcp 2.3 → legacy mcp1 server: every retry of an input round lands on another replica than the
    one holding the parked call."""
    failed = failures(steady, "modern", run)
    assert not failed, f"{steady.passed('modern', run)} passed; failed:\n{failed}"


def test_requests_are_spread_over_the_replicas_and_forwarding_was_exercised(steady: Steady):
    shares = {
        label: {name: n / max(1.0, sum(counts.values())) for name, n in counts.items()}
        for label, counts in steady.requests.items()
    }
    spread = " ".join(
        "/".join(f"{round(100 * share)}" for share in by_replica.values()) + "%" for by_replica in shares.values()
    )
    forwards = f"forwards resume {steady.forwards['resume']:g} deliver {steady.forwards['deliver']:g}"
    tally.replicas("spread", f"spread {spread}, {forwards}")
    for label, counts in steady.requests.items():
        assert sum(counts.values()) >= 100, f"{label}: too few requests to judge a spread: {counts}"
    assert {label: max(s.values()) for label, s in shares.items() if max(s.values()) > MAX_SHARE} == {}, shares
    # The forwarding paths were taken: a retry resumed on the parked call's replica, an answer
    # delivered to the replica waiting for it.
    assert steady.forwards["resume"] > 0, steady.forwards
    assert steady.forwards["deliver"] > 0, steady.forwards
