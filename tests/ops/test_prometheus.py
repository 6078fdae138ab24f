"""The dashboard's queries and the chart's alert rules in a real Prometheus (Debian's 2.42, the
package that ships promtool: scripts/setup-services.sh) scraping a real proxy, in front of the
scripted stdio server, after real traffic of both eras. Everything listens on 127.0.0.1; both
processes are stopped by their PIDs.

- every dashboard query evaluates, and the panels the traffic feeds return data;
- every series the proxy's /metrics carries is one tests/test_ops.py's model of the exports knows,
  with only the labels it knows (the model the name checks rely on matches the real scrape);
- every alert rule evaluates without error on the real series, and McpEraProxyDown fires once the
  proxy is gone.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import legacy_client, modern_client
from tests.support.mcp_client import Endpoint, answer_to
from tests.support.procs import Process, proxy_listener, serving
from tests.test_ops import TARGET_LABELS, alerts, dashboard, dashboard_queries, exported, render

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "support" / "stdio_server.py"
JOB = "mcp-era-proxy"
WAIT = 60.0  # bound on every wait: Prometheus scrapes and evaluates each second


@dataclass
class Scraped:
    prometheus: str  # base URL of its HTTP API
    proxy: Process

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.prometheus}/-/ready", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:  # 503 until its storage is open
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def until(self, what: str, check: Any) -> Any:
        """Poll `check()` until it returns something true, within WAIT."""
        deadline = time.monotonic() + WAIT
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {WAIT}s")
            time.sleep(0.2)


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("prometheus not found: bash scripts/setup-services.sh installs it")
    return found


def traffic(url: str) -> None:
    """Legacy and modern calls through the proxy, and one it must refuse."""
    endpoint = Endpoint(url)
    session = legacy_client.open_session(endpoint)
    for request_id, method, params in [
        (1, "tools/list", None),
        (2, "tools/call", {"name": "echo", "arguments": {"text": "hi"}}),
        (3, "ping", None),
    ]:
        reply = legacy_client.call(endpoint, session, request_id, method, params)
        assert reply.status == 200 and "result" in (answer_to(reply, request_id) or {}), reply
    reply = modern_client.call(endpoint, 4, "tools/call", {"name": "echo", "arguments": {"text": "modern"}})
    assert reply.status == 200 and "result" in (answer_to(reply, 4) or {}), reply
    refused = endpoint.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, [("Mcp-Session-Id", "forged")])
    assert refused.status in (400, 404), refused


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    work = tmp_path_factory.mktemp("prometheus")
    # The defaults, selecting this scrape's job, with McpEraProxyDown firing at once.
    selector = f'prometheusRule.selector=job="{JOB}"'
    rule = render("--set", f"prometheusRule.enabled=true,{selector}", "--set", "prometheusRule.alerts.down.for=0s")
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    proxy_argv = [
        sys.executable,
        "-m",
        "proxy",
        "--upstream-command",
        f"{sys.executable} {SERVER}",
        "--upstream-era",
        "legacy",
        "--listen",
        "127.0.0.1:0",
    ]
    with serving(proxy_argv, work / "proxy.log", cwd=REPO, announced=proxy_listener()) as proxy:
        targets = [f"127.0.0.1:{proxy.port}"]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(work / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [{"targets": targets, "labels": {"namespace": "ops", "pod": f"{JOB}-0"}}],
                }
            ],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        prometheus_argv = [
            prometheus_binary(),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            "--web.listen-address=127.0.0.1:0",
        ]
        with serving(prometheus_argv, work / "prometheus.log", timeout=60) as prometheus:
            yield from _scraped(f"http://127.0.0.1:{prometheus.port}", proxy)


def _scraped(prometheus: str, proxy: Process) -> Iterator[Scraped]:
    scraped = Scraped(prometheus, proxy)
    scraped.until("Prometheus ready", scraped.ready)
    scraped.until("the proxy scraped", lambda: scraped.query(f'up{{job="{JOB}"}} == 1'))
    traffic(f"http://127.0.0.1:{proxy.port}/mcp")
    # rate() needs two scrapes of each new series; the rules at least one evaluation after.
    rejected = f'mcp_era_proxy_requests_total{{job="{JOB}",outcome="rejected"}}'
    scraped.until("two scrapes after the traffic", lambda: scraped.query(f"count_over_time({rejected}[1m]) >= 3"))
    yield scraped


def test_every_dashboard_query_evaluates_and_the_panels_fed_by_the_traffic_show_data(scraped: Scraped):
    with_data: dict[str, bool] = {}
    for panel in dashboard()["panels"]:
        board = {"panels": [panel]}
        for _, expr in dashboard_queries(board):  # each evaluates (a bad one fails in api())
            with_data[panel["title"]] = with_data.get(panel["title"], False) or bool(scraped.query(expr))
    # Not fed here: the store, forwards, input rounds, upstream errors, expirations, resumed
    # streams, the cache (the scripted server's lists are not cached without its list_changed).
    fed = {
        "Requests by method",
        "Requests by outcome",
        "Error ratio",
        "Latency by method (p50, p95, p99)",
        "Requests by era",
        "Legacy sessions open",
        "Streams open by kind",
        "Upstream processes and SSE sessions",
        "Cache size",
        "Event loop tasks",
        "Targets up",
    }
    assert sorted(title for title in fed if not with_data[title]) == []


def test_the_real_scrape_carries_only_series_and_labels_the_model_knows(scraped: Scraped):
    series = scraped.api("series", **{"match[]": f'{{job="{JOB}"}}'})
    seen: dict[str, set[str]] = {}
    for labels in series:
        name = labels.pop("__name__")
        # Prometheus's own (scrape_*, the alerts' ALERTS*) and prometheus_client's creation times
        if name.startswith(("scrape_", "ALERTS")) or name.endswith("_created"):
            continue
        seen.setdefault(name, set()).update(labels)
    assert "mcp_era_proxy_request_duration_seconds_bucket" in seen and "up" in seen
    unknown = {name: sorted(labels) for name, labels in seen.items() if name not in exported()}
    assert unknown == {}
    extra = {name: sorted(labels - exported()[name] - TARGET_LABELS) for name, labels in seen.items()}
    assert {name: labels for name, labels in extra.items() if labels} == {}


def test_every_alert_rule_evaluates_on_the_real_series(scraped: Scraped):
    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for group in scraped.api("rules")["groups"] for r in group["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if rules and done else None

    rules = scraped.until("every rule evaluated", evaluated)
    expected = alerts(render("--set", "prometheusRule.enabled=true"))
    assert sorted(r["name"] for r in rules) == sorted(r["alert"] for r in expected)
    assert {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"} == {}
    firing = [a["labels"]["alertname"] for a in scraped.api("alerts")["alerts"] if a["state"] == "firing"]
    assert firing == [], firing  # healthy traffic: nothing fires


def test_the_down_alert_fires_once_the_proxy_is_gone(scraped: Scraped):
    scraped.proxy.stop()

    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in scraped.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "McpEraProxyDown" and a["state"] == "firing"
        ]

    alert = scraped.until("McpEraProxyDown firing", firing)[0]
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["pod"] == f"{JOB}-0"
    assert alert["annotations"]["summary"].startswith("mcp-era-proxy target 127.0.0.1:")
