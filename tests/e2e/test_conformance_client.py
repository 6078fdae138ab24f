"""The conformance runner's client scenarios, with the proxy on the client's side of the wire.

Seen from a 2026-07-28 server, a legacy host plus the proxy is a 2026-07-28 client, and the runner
judges it as one: each scenario's server is the runner's own, the client under test is
tests/e2e/peers/conformance_through_proxy.py (the proxy in front of the runner's URL, a TypeScript
SDK v1 host behind it). The reference is a native modern client (the TypeScript SDK v2 host, pinned
to 2026-07-28) doing the same steps against the runner directly. The 2025-11-25 scenarios put the
proxy between a legacy host and the runner's legacy servers, which hand out no session id.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests.support import peers
from tests.support.conformance import (
    CLIENT_SCENARIOS_2025_11_25,
    CLIENT_SCENARIOS_2026_07_28,
    not_passed,
    run_client_scenario,
    verdicts,
)

HOST = peers.PEER_SCRIPTS / "conformance_client.cjs"
THROUGH_PROXY = peers.PEER_SCRIPTS / "conformance_through_proxy.py"


def through_proxy(log: Path) -> str:
    return shlex.join([sys.executable, str(THROUGH_PROXY), str(log)])


def native(sdk: str) -> str:
    return shlex.join(["node", str(HOST), sdk])


@pytest.mark.parametrize("scenario", CLIENT_SCENARIOS_2026_07_28)
def test_a_legacy_host_through_the_proxy_passes_the_2026_07_28_client_scenarios(
    scenario: str, tmp_path: Path, logs_dir: Path
):
    proxied = run_client_scenario(
        through_proxy(logs_dir / f"client-scenario-{scenario}.log"), scenario, "2026-07-28", tmp_path / "proxied"
    )
    reference = run_client_scenario(native("v2"), scenario, "2026-07-28", tmp_path / "native")
    assert not not_passed(proxied), not_passed(proxied)
    # Nothing the runner tried was left out: every check the native client earned, the proxy
    # earned too (a check the client never exercised is SKIPPED in both).
    assert any(c["status"] == "SUCCESS" for c in proxied)
    ours, theirs = verdicts(proxied), verdicts(reference)
    assert {k for k, v in theirs.items() if v == "SUCCESS"} <= {k for k, v in ours.items() if v == "SUCCESS"}, (
        ours,
        theirs,
    )


@pytest.mark.parametrize("scenario", CLIENT_SCENARIOS_2025_11_25)
def test_a_legacy_host_through_the_proxy_passes_the_2025_11_25_client_scenarios_against_a_sessionless_server(
    scenario: str, tmp_path: Path, logs_dir: Path
):
    proxied = run_client_scenario(
        through_proxy(logs_dir / f"client-scenario-2025-{scenario}.log"), scenario, "2025-11-25", tmp_path / "proxied"
    )
    direct = run_client_scenario(native("v1"), scenario, "2025-11-25", tmp_path / "direct")
    assert not not_passed(direct), not_passed(direct)
    assert verdicts(proxied) == verdicts(direct)
