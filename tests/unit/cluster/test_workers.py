"""--workers: what each worker listens on and advertises, and the settings refused (proxy/cluster/workers.py)."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
import structlog

from proxy import logs
from proxy.cluster.workers import restart_delay, shifted, worker_settings
from proxy.config import ConfigError, Settings, load_settings
from proxy.logs import configure_logging

SECRET = "0123456789abcdef0123"
STORE = "redis://127.0.0.1:6379/0"


def settings(**overrides: Any) -> Settings:
    base = {
        "upstream.url": "http://127.0.0.1:1/mcp",
        "security.secret": SECRET,
        "store.url": STORE,
        "workers": 3,
        "downstream.sse.enabled": False,  # else replicas.internal_listen is required (tested below)
    }
    return load_settings(None, **{**base, **overrides})


def test_each_worker_gets_its_own_admin_and_internal_ports_and_shares_the_mcp_port() -> None:
    config = settings(admin_listen="127.0.0.1:9090", **{"replicas.internal_listen": "0.0.0.0:8081"})
    ports = [
        (w.listen, w.admin_listen, w.replicas.internal_listen, w.replicas.advertised)
        for w in (worker_settings(config, i) for i in range(3))
    ]
    assert ports == [
        ("127.0.0.1:8080", "127.0.0.1:9090", "0.0.0.0:8081", "0.0.0.0:8081"),
        ("127.0.0.1:8080", "127.0.0.1:9091", "0.0.0.0:8082", "0.0.0.0:8082"),
        ("127.0.0.1:8080", "127.0.0.1:9092", "0.0.0.0:8083", "0.0.0.0:8083"),
    ]
    assert worker_settings(config, 2).workers == 3  # still a worker of three: the MCP port is shared


def test_an_advertised_address_moves_with_the_worker_and_ipv6_keeps_its_brackets() -> None:
    config = settings(
        **{"replicas.internal_listen": "[::]:8081", "replicas.advertise": "10.1.2.3:18081"},
    )
    second = worker_settings(config, 1)
    assert second.replicas.internal_listen == "[::]:8082"
    assert second.replicas.advertised == "10.1.2.3:18082"
    assert second.admin_listen is None  # the admin endpoints stay on the shared MCP port
    assert shifted("[::1]:9090", 2) == "[::1]:9092"


def test_more_workers_need_the_store_and_the_secret() -> None:
    with pytest.raises(ConfigError, match=re.escape("workers > 1 needs store.url")):
        load_settings(None, **{"upstream.url": "http://127.0.0.1:1/mcp", "security.secret": SECRET, "workers": 2})
    with pytest.raises(ConfigError, match=re.escape("security.secret is required")):
        load_settings(None, **{"upstream.url": "http://127.0.0.1:1/mcp", "store.url": STORE, "workers": 2})


def test_more_workers_serving_http_sse_clients_need_the_internal_listener() -> None:
    """An HTTP+SSE client's POST lands on any worker: it must reach the one holding its stream."""
    with pytest.raises(ConfigError, match=re.escape("downstream.sse.enabled with workers > 1 needs")):
        settings(**{"downstream.sse.enabled": True})
    assert settings(**{"downstream.sse.enabled": True, "replicas.internal_listen": "127.0.0.1:8081"}).workers == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"admin_listen": "127.0.0.1:8079"}, "listen (port 8080) and admin_listen (ports 8079..8081) overlap"),
        ({"replicas.internal_listen": "0.0.0.0:8078"}, "listen (port 8080) and replicas.internal_listen (ports 8078"),
        (
            {"admin_listen": "127.0.0.1:9090", "replicas.internal_listen": "0.0.0.0:9092"},
            "admin_listen (ports 9090..9092) and replicas.internal_listen (ports 9092..9094) overlap",
        ),
        ({"admin_listen": "127.0.0.1:65534"}, "ports 65534..65536 pass 65535"),
        ({"replicas.internal_listen": "0.0.0.0:8081", "replicas.advertise": "10.0.0.1:65535"}, "pass 65535"),
    ],
)
def test_port_ranges_of_the_workers_that_clash_are_refused(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings(**overrides)


def test_one_worker_may_use_neighbouring_ports() -> None:
    assert settings(workers=1, admin_listen="127.0.0.1:8081").workers == 1


def test_an_advertised_port_may_equal_one_of_ours() -> None:
    # It is the port other hosts reach (a NAT, the pod IP): nothing here binds it.
    config = settings(**{"replicas.internal_listen": "0.0.0.0:8081", "replicas.advertise": "10.0.0.1:8080"})
    assert worker_settings(config, 1).replicas.advertised == "10.0.0.1:8081"


def test_every_log_line_of_a_worker_carries_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    try:
        configure_logging("info", "json", worker=1)
        structlog.get_logger("test").info("listening", address="x")
        configure_logging("info", "json")  # writes the first one's lines out first
        structlog.get_logger("test").info("listening", address="y")
    finally:
        logs.stop()  # the lines written out
        structlog.reset_defaults()
    first, second = (json.loads(line) for line in err.getvalue().splitlines())
    assert first["worker"] == 1 and first["address"] == "x"
    assert "worker" not in second


def test_a_worker_that_keeps_dying_is_restarted_ever_later_up_to_a_ceiling() -> None:
    assert [restart_delay(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay(10_000) == 30.0  # no overflow however long it goes on
