"""The chart's Grafana dashboard and Prometheus alert rules: they parse (promtool), the alerts fire
when they should and only then (promtool test rules, tests/ops/alerts.test.yaml), and every metric
and label they name is one the proxy exports.

Needs helm ($HELM, else the pinned binary scripts/lint-deploy.sh fetches into the test cache, else
`helm` on PATH) and promtool (scripts/setup-services.sh installs Debian's prometheus package).
scripts/lint-deploy.sh runs this file; tests/ops/test_prometheus.py runs the same rules and
queries in a real Prometheus."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from proxy.metrics import KNOWN_METHODS, OUTCOMES, STREAM_KINDS, Metrics

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "mcp-era-proxy"
DASHBOARD = CHART / "dashboards" / "mcp-era-proxy.json"
UNIT_TESTS = REPO / "tests" / "ops" / "alerts.test.yaml"
CACHE = Path(os.environ.get("ERA_PROXY_TEST_CACHE", Path.home() / ".cache" / "mcp-era-proxy"))
# Values every render starts from: the chart needs an upstream.
BASE_VALUES = CHART / "examples" / "standalone.yaml"

# Label values the proxy declares: a matcher naming a value outside them matches nothing.
LABEL_VALUES = {"outcome": frozenset(OUTCOMES), "method": KNOWN_METHODS | {"other"}}
_ALTERNATIVES = re.compile(r"[\w/.]+(?:\|[\w/.]+)*")

# Labels Prometheus gives every scraped series: the Prometheus Operator's ServiceMonitor targets
# carry these (job is the Service's name); the dashboard's variables and the alerts group by them.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "container", "endpoint"})


def _tool(name: str, env: str | None, *candidates: Path) -> str:
    if env and os.environ.get(env):
        return os.environ[env]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} not found: run bash scripts/lint-deploy.sh (helm) and bash scripts/setup-services.sh (promtool)"
        )
    return found


def helm() -> str:
    return _tool("helm", "HELM", *sorted(CACHE.glob("tools/helm-*/helm"), reverse=True))


def promtool() -> str:
    return _tool("promtool", None)


def render(*args: str, show: str = "templates/prometheusrule.yaml") -> dict[str, Any]:
    out = subprocess.run(
        [helm(), "template", "mcp-era-proxy", str(CHART), "-f", str(BASE_VALUES), *args, "--show-only", show],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    document = yaml.safe_load(out.stdout)
    assert isinstance(document, dict)
    return document


@functools.cache
def default_rule() -> dict[str, Any]:
    return render("--set", "prometheusRule.enabled=true")


def alerts(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


# ---------------------------------------------------------------- what the proxy exports


@functools.cache
def exported() -> dict[str, frozenset[str]]:
    """Every series name the proxy's /metrics can carry, with its labels (target labels aside)."""
    metrics = Metrics()
    metrics.store_up.set(1)  # registered only where a store reports (absent without one)
    families = {family.name: family.type for family in metrics.registry.collect()}
    declared = {name: labels for name, _, labels, _ in metrics.described()}
    assert set(declared) == set(families), "Metrics has a collector that is not an attribute (or the reverse)"
    series: dict[str, frozenset[str]] = {"up": frozenset()}
    for name, kind in families.items():
        labels = frozenset(declared[name])
        if kind == "counter":
            series[name + "_total"] = labels
        elif kind == "histogram":
            series[name + "_bucket"] = labels | {"le"}
            series[name + "_sum"] = series[name + "_count"] = labels
        elif kind == "gauge":
            series[name] = labels
        else:
            raise AssertionError(f"{name}: a {kind} metric; teach exported() its series names")
    return series


# ---------------------------------------------------------------- a PromQL reader for names

_TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)|(?P<range>\[[^\]]*\])"""
    r"""|(?P<number>\d[\w.]*)|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)"""
    r"""|(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}]))"""
)
AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"}
)
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = GROUPING | {"bool", "offset", "and", "or", "unless", "inf", "nan"}


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        match = _TOKEN.match(expr, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"cannot read PromQL at {expr[pos : pos + 20]!r}")
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


def _close(toks: list[tuple[str, str]], start: int, pair: tuple[str, str] = ("(", ")")) -> int:
    """Index of the bracket closing the one at `start`."""
    depth = 0
    for i in range(start, len(toks)):
        if toks[i] == ("op", pair[0]):
            depth += 1
        elif toks[i] == ("op", pair[1]):
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced brackets")


def _label_list(toks: list[tuple[str, str]], start: int) -> tuple[list[str], int]:
    """The labels of `(a, b)` at `start`, and the index after it."""
    end = _close(toks, start)
    return [value for kind, value in toks[start + 1 : end] if kind == "ident"], end + 1


def problems(expr: str) -> list[str]:
    """What `expr` names that the proxy does not export: unknown metrics, labels a selector
    matches or a grouping names that its metrics do not carry."""
    toks = tokens(expr)
    found: list[str] = []
    in_label_lists = set()  # the tokens of by/on/... (label, ...) lists: labels, not metrics
    for i, (kind, value) in enumerate(toks[:-1]):
        if kind == "ident" and value in GROUPING and toks[i + 1] == ("op", "("):
            in_label_lists.update(range(i + 1, _close(toks, i + 1) + 1))
    selectors: list[tuple[int, str]] = []  # (token index, metric name)
    groupings: list[tuple[int, int, list[str], str]] = []  # (first, last token of the scope, labels, clause)
    i = 0
    while i < len(toks):
        kind, value = toks[i]
        following = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if i in in_label_lists:
            i += 1
        elif kind == "ident" and value in AGGREGATIONS and following[1] in ("(", "by", "without"):
            clause, labels = value, []
            if following[1] in ("by", "without"):
                clause = f"{value} {following[1]}"
                labels, arg = _label_list(toks, i + 2)
                end = _close(toks, arg)
            else:
                arg, end = i + 1, _close(toks, i + 1)
                if end + 1 < len(toks) and toks[end + 1][1] in ("by", "without"):
                    clause = f"{value} {toks[end + 1][1]}"
                    labels, _ = _label_list(toks, end + 2)
            groupings.append((arg, end, labels, clause))
            i += 1
        elif kind == "ident" and value in ("on", "ignoring", "group_left", "group_right") and following[1] == "(":
            labels, after = _label_list(toks, i + 1)
            groupings.append((0, len(toks) - 1, labels, value))
            i = after
        elif kind == "ident" and (following[1] == "(" or value.lower() in KEYWORDS):
            i += 1
        elif kind == "ident" or (kind == "op" and value == "{"):
            name = value if kind == "ident" else ""
            if name not in exported():
                found.append(f"metric {name or '(no name)'} is not one the proxy exports")
            selectors.append((i, name))
            brace = i + 1 if kind == "ident" else i
            if brace < len(toks) and toks[brace] == ("op", "{"):
                end = _close(toks, brace, ("{", "}"))
                for j in range(brace + 1, end):
                    if toks[j][0] == "ident" and toks[j + 1][1] in ("=", "!=", "=~", "!~"):
                        label = toks[j][1]
                        if name in exported() and label not in exported()[name] | TARGET_LABELS:
                            found.append(f"{name} has no label {label}")
                        found.extend(_unknown_values(label, toks[j + 1][1], toks[j + 2][1]))
                i = end + 1
            else:
                i += 1
        else:
            i += 1
    for first, last, labels, clause in groupings:
        scope = [name for index, name in selectors if first <= index <= last and name in exported()]
        for label in labels:
            if label in TARGET_LABELS:
                continue
            missing = [name for name in scope if label not in exported()[name]]
            if missing or not scope:
                found.append(f"{clause} ({label}): not a label of {', '.join(missing) or 'any metric in scope'}")
    return found


def _unknown_values(label: str, op: str, quoted: str) -> list[str]:
    """A matcher of a declared label whose literal value (or a|b|c alternation) the proxy never sets."""
    value = quoted[1:-1]
    if label not in LABEL_VALUES or op not in ("=", "=~", "!=", "!~") or not _ALTERNATIVES.fullmatch(value):
        return []
    unknown = [v for v in value.split("|") if v not in LABEL_VALUES[label]]
    return [f"{label} {op} {quoted}: the proxy sets no {label} {v!r}" for v in unknown]


# Grafana's variables, as a query would see them.
_GRAFANA_RANGE = re.compile(r"\$(?:__rate_interval|__interval|__range)|\$\{__(?:rate_interval|interval|range)\}")
_GRAFANA_VARIABLE = re.compile(r"\$\{?\w+\}?")


def substitute(expr: str) -> str:
    out = _GRAFANA_VARIABLE.sub(".*", _GRAFANA_RANGE.sub("5m", expr))
    assert "$" not in out, expr
    return out


def dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target, Grafana's variables substituted."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((f"panel {inner['id']} {inner['title']!r} {target['refId']}", substitute(target["expr"])))
    return found


def variable_queries(board: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, metric selector, label) of each `label_values(selector, label)` variable."""
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text)
        assert match, f"variable {variable['name']}: {text!r} is not label_values(selector, label)"
        found.append((variable["name"], substitute(match.group(1)), match.group(2)))
    return found


# ---------------------------------------------------------------- the checker itself can fail


@pytest.mark.parametrize(
    ("expr", "complaint"),
    [
        ("sum(rate(mcp_era_proxy_requests_totl[5m]))", "metric mcp_era_proxy_requests_totl"),
        ("mcp_era_proxy_requests", "metric mcp_era_proxy_requests"),  # a counter's name without _total
        ("rate(mcp_era_proxy_request_duration_seconds[5m])", "metric mcp_era_proxy_request_duration_seconds"),
        ('{__name__="mcp_era_proxy_parked_calls"}', "metric (no name)"),
        ('mcp_era_proxy_parked_calls{outcome="ok"}', "mcp_era_proxy_parked_calls has no label outcome"),
        ("sum by (methd) (rate(mcp_era_proxy_requests_total[5m]))", "by (methd)"),
        ("sum(rate(mcp_era_proxy_requests_total[5m])) by (scope)", "by (scope)"),
        ("histogram_quantile(0.9, sum by (le) (rate(mcp_era_proxy_request_duration_seconds_count[5m])))", "by (le)"),
        ("mcp_era_proxy_parked_calls / on (upstream) mcp_era_proxy_upstream_processes", "on (upstream)"),
        ('mcp_era_proxy_requests_total{outcome=~"error|failed"}', "no outcome 'failed'"),
        ('mcp_era_proxy_requests_total{method!="tools/run"}', "no method 'tools/run'"),
    ],
)
def test_the_name_check_refuses_what_the_proxy_does_not_export(expr: str, complaint: str):
    assert any(complaint in problem for problem in problems(expr)), problems(expr)


def test_the_name_check_accepts_what_the_proxy_exports():
    bucket = 'mcp_era_proxy_request_duration_seconds_bucket{job="x",method!~"ping|other"}'
    expr = f"histogram_quantile(0.99, sum by (method, le, pod) (rate({bucket}[5m]))) > 1 and on (namespace) up == 1"
    assert problems(expr) == []


def test_an_unknown_metric_in_the_dashboard_fails_the_dashboard_check():
    board = copy.deepcopy(dashboard())
    board["panels"][1]["targets"][0]["expr"] = 'sum(rate(mcp_era_proxy_request_total{pod=~"$pod"}[$__rate_interval]))'
    assert any("mcp_era_proxy_request_total" in p for _, expr in dashboard_queries(board) for p in problems(expr))


def test_promtool_refuses_an_expression_that_does_not_parse(tmp_path: Path):
    (tmp_path / "rules.yaml").write_text(recording_rules([("bad", "sum by (method (rate(up[5m]))")]))
    assert run_promtool("check", "rules", "rules.yaml", cwd=tmp_path).returncode != 0


# ---------------------------------------------------------------- the dashboard


def recording_rules(queries: list[tuple[str, str]]) -> str:
    rules = [{"record": f"dashboard:query_{n}", "expr": expr} for n, (_, expr) in enumerate(queries)]
    return yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False)


def test_every_dashboard_query_parses(tmp_path: Path):
    queries = dashboard_queries(dashboard())
    assert len(queries) > 25
    (tmp_path / "rules.yaml").write_text(recording_rules(queries))
    out = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(queries)} rules found" in out.stdout


def test_every_dashboard_query_names_only_what_the_proxy_exports():
    found = {where: problems(expr) for where, expr in dashboard_queries(dashboard())}
    assert {where: p for where, p in found.items() if p} == {}


def test_the_dashboard_variables_read_labels_the_proxy_series_carry():
    variables = variable_queries(dashboard())
    assert [name for name, _, _ in variables] == ["namespace", "job", "pod"]
    for name, selector, label in variables:
        assert problems(selector) == [], name
        assert label in TARGET_LABELS, name


def test_the_dashboard_is_parameterised_by_data_source_and_uses_every_exported_metric():
    board = dashboard()
    datasource = board["templating"]["list"][0]
    assert (datasource["name"], datasource["type"], datasource["query"]) == ("datasource", "datasource", "prometheus")
    text = json.dumps(board["panels"])
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    assert rows == [
        "Traffic",
        "Sessions and streams",
        "Upstream",
        "Input rounds and parked calls",
        "Response cache",
        "Shared store and replicas",
        "Process health",
    ]
    families = {name for name in exported() if not name.endswith(("_sum", "_count"))}
    assert sorted(name for name in families if not re.search(rf"\b{name}\b", text)) == []


def test_the_dashboard_legends_name_labels_of_their_queries():
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = substitute(target["expr"])
            names = {value for kind, value in tokens(expr) if kind == "ident" and value in exported()}
            carried = set().union(*(exported()[name] for name in names)) | TARGET_LABELS
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            assert legend <= carried, f"{panel['title']!r} {target['refId']}: legend names {legend - carried}"


def test_the_dashboard_panels_have_unique_ids_and_do_not_overlap():
    panels = dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] >= 0 and box["x"] + box["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells


def test_the_chart_ships_the_dashboard_only_when_enabled():
    configmap = render(
        "--set",
        "dashboards.enabled=true,dashboards.annotations.grafana_folder=MCP",
        show="templates/dashboards-configmap.yaml",
    )
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "MCP"}
    assert json.loads(configmap["data"]["mcp-era-proxy.json"]) == dashboard()
    default = subprocess.run(
        [helm(), "template", "x", str(CHART), "-f", str(BASE_VALUES)], capture_output=True, text=True, timeout=60
    )
    assert default.returncode == 0, default.stderr
    assert "kind: PrometheusRule" not in default.stdout and "grafana_dashboard" not in default.stdout


# ---------------------------------------------------------------- the alert rules


def write_rules(rule: dict[str, Any], directory: Path) -> None:
    (directory / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))


def test_promtool_checks_the_rendered_rules(tmp_path: Path):
    write_rules(default_rule(), tmp_path)
    out = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts(default_rule()))} rules found" in out.stdout


def test_the_alerts_fire_when_they_should_and_only_then(tmp_path: Path):
    write_rules(default_rule(), tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    out = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_unit_tests_notice_a_changed_threshold(tmp_path: Path):
    rule = render("--set", "prometheusRule.enabled=true", "--set-json", "prometheusRule.alerts.errorRatio.ratio=0.5")
    write_rules(rule, tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    out = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert out.returncode != 0 and "McpEraProxyHighErrorRatio" in out.stdout + out.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_must_not():
    cases: dict[str, set[bool]] = {}
    for group in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for case in group["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case["exp_alerts"]))
    names = [rule["alert"] for rule in alerts(default_rule())]
    assert {name: cases.get(name, set()) for name in names} == {name: {True, False} for name in names}


def test_every_alert_names_only_what_the_proxy_exports_and_is_documented():
    page = (REPO / "docs" / "operate" / "observability.md").read_text(encoding="utf-8")
    section = page.split("\n## Dashboard and alerts\n", 1)[1].split("\n## ", 1)[0]
    rules = alerts(default_rule())
    assert len(rules) == 12
    for rule in rules:
        assert problems(rule["expr"]) == [], rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        assert f"`{rule['alert']}`" in section, f"{rule['alert']} is not in the observability page's alerts"


def test_the_limits_follow_the_proxy_config_and_the_values():
    rule = render(
        "--set",
        "prometheusRule.enabled=true,config.sessions.max_sessions=200,config.input.max_parked=50",
        "--set",
        'prometheusRule.selector=cluster="eu1",prometheusRule.additionalLabels.team=mcp',
        "--set",
        "prometheusRule.alerts.down.enabled=false,prometheusRule.alerts.storeDown.for=7m",
    )
    by_name = {r["alert"]: r for r in alerts(rule)}
    assert "McpEraProxyDown" not in by_name and len(by_name) == 11
    assert by_name["McpEraProxySessionsNearLimit"]["expr"].endswith("> 180")
    assert by_name["McpEraProxyParkedCallsNearLimit"]["expr"].endswith("> 40")
    assert by_name["McpEraProxyStoreDown"]["for"] == "7m"
    for r in by_name.values():
        assert 'cluster="eu1"' in r["expr"] and "namespace=" not in r["expr"], r["alert"]
        assert r["labels"]["team"] == "mcp"


def test_every_streams_open_kind_the_proxy_exports_is_the_one_the_metrics_reference_documents() -> None:
    text = (REPO / "docs" / "reference" / "metrics.md").read_text()
    [row] = [line for line in text.splitlines() if line.startswith("- `kind` of `mcp_era_proxy_streams_open`:")]
    documented = set(re.findall(r"`(downstream_\w+|upstream_\w+)`", row))
    exposition = generate_latest(Metrics().registry).decode()
    exported = set(re.findall(r'mcp_era_proxy_streams_open\{kind="(\w+)"\}', exposition))
    assert exported == documented == set(STREAM_KINDS)
    # And each is one the proxy counts somewhere (no kind exported that nothing moves).
    sources = "\n".join(p.read_text() for p in (REPO / "proxy").rglob("*.py"))
    assert {kind for kind in exported if f'streams_open.labels("{kind}")' in sources} == exported
