"""The README documents every log event and every metric the proxy emits (the operator's catalog)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import proxy
from proxy.metrics import Metrics

README = (Path(proxy.__file__).parents[1] / "README.md").read_text()


def log_events() -> set[str]:
    events = set()
    for path in Path(proxy.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                events.add(node.args[0].value)
    return events


def metric_names() -> set[str]:
    return {family.name + ("_total" if family.type == "counter" else "") for family in Metrics().registry.collect()}


def test_the_catalog_scan_finds_events_and_metrics():
    assert "request" in log_events() and len(log_events()) > 20
    assert "mcp_era_proxy_requests_total" in metric_names()


@pytest.mark.parametrize("event", sorted(log_events()))
def test_every_log_event_is_documented(event: str):
    assert f"`{event}`" in README


@pytest.mark.parametrize("name", sorted(metric_names()))
def test_every_metric_is_documented(name: str):
    assert f"`{name}`" in README
