"""The migration report with real clients (proxy/clients.py; README "Retiring the bridge"): after the
mcp 1.30 legacy client, the TypeScript SDK v1 (a legacy host) and the mcp 2.3 modern client made
requests through the proxy, GET /clients and the metric name each with its version, protocol
version and era."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.procs import proxy_listener, serving
from tests.support.sdk_drivers import run_legacy_client, run_modern_client, run_node_host

pytestmark = pytest.mark.e2e


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def test_clients_and_the_metric_name_every_real_client_with_its_version_protocol_and_era(
    legacy_server: str, logs_dir: Path
) -> None:
    argv = [sys.executable, "-m", "proxy", "--upstream", legacy_server, "--listen", "127.0.0.1:0"]
    argv += ["--admin-listen", "127.0.0.1:0"]
    with serving(argv, logs_dir / "migration-report.log", announced=proxy_listener()) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        admin = f"http://127.0.0.1:{proxy_listener('admin')(proxy.output())}"
        for run in (run_legacy_client, run_modern_client):
            observed = run(url, "tools", {"tool": "echo", "arguments": {"text": "report"}})
            assert "error" not in observed, observed
        run_node_host("apps_host.cjs", {"sdk": "v1", "url": url, "call": []})  # the TypeScript SDK v1
        rows = json.loads(get(f"{admin}/clients"))["clients"]
        metrics = get(f"{admin}/metrics").decode()
    by_name = {(row["name"], row["era"]): row for row in rows}
    python_legacy = by_name[("legacy-client-peer", "legacy")]
    assert python_legacy["version"] == "1.30.0" and python_legacy["protocolVersion"].startswith("2025-")
    assert python_legacy["sessions"] == 1 and python_legacy["requests"] >= 3  # initialize, initialized, the call
    ts_legacy = by_name[("apps-host", "legacy")]
    assert ts_legacy["version"] == "1.0.0" and ts_legacy["protocolVersion"].startswith("2025-")
    modern = by_name[("modern-client-peer", "modern")]
    assert modern["version"] == "2.3.0" and modern["protocolVersion"] == "2026-07-28" and modern["sessions"] == 0
    for row in (python_legacy, ts_legacy, modern):
        label = (
            f'mcp_era_proxy_client_requests_total{{client="{row["name"]}",client_version="{row["version"]}",'
            f'era="{row["era"]}",protocol_version="{row["protocolVersion"]}"}}'
        )
        assert label in metrics, label
