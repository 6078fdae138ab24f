"""Three replicas of the proxy CLI, real SDK clients spread across them: each request goes to the
next replica in turn (a round-robin tap), so an echo (the next request, or the one after) lands on
a replica that does not hold what it names and is forwarded to the one that does
(proxy/cluster/):

- the mcp==2.3.0 modern client against the mcp==1.30.0 legacy server: each MRTR retry;
- the mcp==1.30.0 legacy client against the mcp==2.3.0 modern server, sessions in a real
  redis-server: each answer to an elicitation, sampling or roots request.

Every message the replicas sent the client is validated against the 2026-07-28 schema, and the
replicas' metrics show the forwarding happened (not lucky placement).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import reserved_port
from tests.support.redis_server import redis_server
from tests.support.sdk_drivers import run_legacy_client, run_modern_client
from tests.support.tap import schema_violations

from .conftest import ProxyFactory

pytestmark = pytest.mark.e2e

SECRET = "e2e-replicas-share-this-secret-0123"
SCENARIOS: dict[str, dict[str, Any]] = {
    "elicitation": {"tool": "elicit", "arguments": {"message": "who?"}},
    "sampling": {"tool": "sample", "arguments": {"prompt": "hello"}},
    "roots": {"tool": "roots", "arguments": {}},
    "multi": {"tool": "multi", "arguments": {}},
}


@pytest.fixture(scope="module")
def replicas(start_proxy: ProxyFactory, legacy_server: str) -> Iterator[list[str]]:
    with ExitStack() as stack:
        urls = [
            stack.enter_context(
                start_proxy(
                    legacy_server,
                    security__secret=SECRET,
                    replicas__internal_listen=f"127.0.0.1:{reserved_port()}",  # told to the others
                    upstream__era="legacy",
                )
            )
            for _ in range(3)
        ]
        yield urls


LEGACY_SCENARIOS: dict[str, dict[str, Any]] = {
    "elicitation": {"tool": "elicit", "arguments": {"message": "who?"}},
    "sampling": {"tool": "sample", "arguments": {"prompt": "hello"}},
    "roots": {"tool": "roots", "arguments": {}},
    "multi": {"tool": "multi", "arguments": {}},
}


@pytest.fixture(scope="module")
def legacy_replicas(start_proxy: ProxyFactory, modern_server: str, logs_dir: Path) -> Iterator[list[str]]:
    with redis_server(logs_dir) as redis, ExitStack() as stack:
        urls = [
            stack.enter_context(
                start_proxy(
                    modern_server,
                    security__secret=SECRET,
                    store__url=redis.url,
                    replicas__internal_listen=f"127.0.0.1:{reserved_port()}",
                    upstream__era="modern",
                )
            )
            for _ in range(3)
        ]
        yield urls


def forwards(url: str, kind: str, outcome: str = "ok") -> float:
    """The replica's mcp_era_proxy_forwards_total{kind, outcome} (its /metrics beside /mcp)."""
    with urllib.request.urlopen(url.replace("/mcp", "/metrics"), timeout=5) as response:
        text = response.read().decode()
    pattern = rf'^mcp_era_proxy_forwards_total\{{kind="{kind}",outcome="{outcome}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
def spread(
    replicas: list[str], tap_factory: Callable[..., AbstractContextManager[tuple[str, Path]]]
) -> Iterator[Callable[..., dict[str, Any]]]:
    with tap_factory(*replicas) as (tap_url, record):

        def run(scenario: str) -> dict[str, Any]:
            observed = run_modern_client(tap_url, scenario, SCENARIOS[scenario])
            assert "error" not in observed, observed
            return observed

        yield run
    checked, problems = schema_violations(record)
    assert problems == []
    assert checked > 0


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block.get("type") == "text"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_input_round_completes_with_its_retry_sent_to_the_other_replica(
    spread: Callable[..., dict[str, Any]], replicas: list[str], scenario: str
) -> None:
    before = sum(forwards(url, "resume") for url in replicas)
    observed = spread(scenario)
    after = sum(forwards(url, "resume") for url in replicas)
    rounds = observed["rounds"]
    assert [r["gotResultType"] for r in rounds][-1] == "complete"
    retries = len(rounds) - 1
    assert retries >= 1
    assert after - before == retries  # every retry was forwarded to the replica holding its call
    assert sum(forwards(url, "resume", "owner_gone") for url in replicas) == 0
    if scenario == "elicitation":
        assert len(observed["elicitations"]) == 1  # the user was asked once
        assert "accept" in texts(observed["result"])[0]
    elif scenario == "multi":
        assert observed["callbackTypes"] == ["elicitation", "sampling"]
        assert texts(observed["result"])[0] == "multi: name=Ada sample=sampled-by-client"


def test_legacy_answers_reach_the_replica_that_asked_wherever_they_land(
    legacy_replicas: list[str], tap_factory: Callable[..., AbstractContextManager[tuple[str, Path]]]
) -> None:
    """A session's requests spread over the replicas: the one running a tool asks the client on
    that request's stream; the client's answer (a POST of its own) lands elsewhere and is
    delivered to it. Over these scenarios some answers must have been forwarded."""
    before = sum(forwards(url, "deliver") for url in legacy_replicas)
    with tap_factory(*legacy_replicas) as (tap_url, record):
        for scenario, args in LEGACY_SCENARIOS.items():
            observed = run_legacy_client(tap_url, scenario, args)
            assert "error" not in observed, (scenario, observed)
            if scenario == "elicitation":
                assert len(observed["elicitations"]) == 1  # asked once
            if scenario == "multi":
                assert observed["callbackTypes"] == ["elicitation", "sampling"]
    checked, problems = schema_violations(record)
    assert problems == [] and checked > 0
    delivered = sum(forwards(url, "deliver") for url in legacy_replicas) - before
    assert delivered >= 1
    assert sum(forwards(url, "deliver", "owner_gone") for url in legacy_replicas) == 0
