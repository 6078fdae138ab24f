"""The replica suite's real components: one redis-server for the session, and clusters of proxy
replicas (the CLI, one shared secret, the store on that Redis, an internal listener each) behind
HAProxy in strict round-robin. Upstreams are the real peers of tests/e2e (tests/support/peer_fixtures.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer
from tests.support.replicas import Cluster, cluster

pytestmark = [pytest.mark.e2e, pytest.mark.replicas]

ClusterFactory = Callable[..., AbstractContextManager[Cluster]]


@pytest.fixture(scope="session")
def replica_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replica-logs")


@pytest.fixture(scope="session")
def redis(replica_logs: Path) -> Iterator[RedisServer]:
    """redis-server 7 on 127.0.0.1, empty, nothing persisted; restartable on its port by the tests."""
    server = RedisServer(replica_logs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def make_cluster(replica_logs: Path, redis: RedisServer) -> ClusterFactory:
    """`make_cluster(upstream_url, name)`: three replicas on the shared Redis behind HAProxy."""

    def make(upstream: str, name: str, **settings: str) -> AbstractContextManager[Cluster]:
        # SIGTERM gives calls in flight 5 s (20 by default): what a short rolling update allows,
        # and the bound on a restart while a replica still holds calls nobody will finish.
        return cluster(upstream, replica_logs, name, redis=redis, **{"shutdown__grace_s": "5", **settings})

    return make


@pytest.fixture(scope="session")
def l2m(make_cluster: ClusterFactory, modern_server: str) -> Iterator[Cluster]:
    """For the fault and tampering tests: legacy clients translated for the modern-only mcp2 server
    (their sessions are the proxy's); modern clients pass through."""
    with make_cluster(modern_server, "l2m") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def m2l(make_cluster: ClusterFactory, legacy_server: str) -> Iterator[Cluster]:
    """For the fault and tampering tests: modern clients translated for the legacy mcp1 server (input
    rounds park upstream calls); legacy clients pass through with the server's own sessions."""
    with make_cluster(legacy_server, "m2l") as cluster:
        yield cluster
