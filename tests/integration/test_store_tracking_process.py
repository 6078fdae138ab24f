"""The store's tracked copies in a proxy process as it runs in production (on uvloop, which the
in-process tests do not use): the tracking connection comes up, the process logs nothing but JSON,
and a session's requests are served from the copy instead of one store call each, as the
store_session_reads metric shows (docs/operate/replicas.md §Cost)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from proxy.config import ENV_PREFIX
from tests.support import legacy_client
from tests.support.mcp_client import Endpoint
from tests.support.procs import proxy_listener, serving
from tests.support.redis_server import RedisServer, redis_server

REPO = Path(__file__).resolve().parents[2]
CALLS = 50


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    argv = [sys.executable, "-m", "tests.support.fault_upstream", "--era", "modern", "--port", "0"]
    with serving(argv, tmp_path / "upstream.log", cwd=REPO, timeout=20) as server:
        yield f"http://127.0.0.1:{server.port}/mcp"


def events(log: Path) -> list[str]:
    """Every line the proxy wrote, which must each be a JSON log event: a traceback is a defect."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    not_json = [line for line in lines if not line.startswith("{")]
    assert not not_json, "\n".join(not_json[:20])
    return [json.loads(line)["event"] for line in lines]


def store_reads(url: str) -> int:
    """The session reads Redis has served since the last reset (the read-and-slide script)."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) + int(stats.get("cmdstat_eval", {}).get("calls", 0))


def test_a_proxy_process_serves_a_sessions_requests_from_its_tracked_copy(
    tmp_path: Path, store: RedisServer, upstream: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env = {**clean, f"{ENV_PREFIX}STORE__URL": store.url, f"{ENV_PREFIX}SECURITY__SECRET": "tracking-" + "s" * 32}
    argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"]
    log = tmp_path / "proxy.log"
    with serving(argv, log, announced=proxy_listener(), env=env, cwd=REPO, timeout=30) as proxy:
        endpoint = Endpoint(f"http://127.0.0.1:{proxy.port}/mcp")
        session = legacy_client.open_session(endpoint)  # the store's first use opens the tracking too
        deadline = time.monotonic() + 10
        while "store_tracking_up" not in events(log):
            assert time.monotonic() < deadline, "the tracking connection did not come up"
            time.sleep(0.05)
        assert legacy_client.call(endpoint, session, 0, "tools/list").status == 200  # the copy is made
        redis.Redis.from_url(store.url).config_resetstat()
        for request_id in range(1, CALLS + 1):
            reply = legacy_client.call(endpoint, session, request_id, "tools/call", {"name": "echo", "arguments": {}})
            assert reply.status == 200 and b'"result"' in reply.body, reply
        reads = store_reads(store.url)
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}/metrics", timeout=10) as response:
            exposition = response.read().decode()
    assert reads < CALLS // 10, f"{reads} store reads for {CALLS} requests: the tracked copy was not used"
    served = {
        source: float(value)
        for source, value in re.findall(r'mcp_era_proxy_store_session_reads_total\{source="(\w+)"\} (\S+)', exposition)
    }
    assert served["copy"] >= CALLS - reads and served["store"] >= 1, served  # what operators see of it
    assert "store_tracking_down" not in events(log)
