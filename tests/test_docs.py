"""The README documents every log event and every metric the proxy emits (the operator's catalog),
and every configuration key with its actual default."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

import proxy
from proxy.config import Settings
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


# ---------------------------------------------------------------- the configuration table


def config_table() -> dict[str, str]:
    """README §Configuration: every key the table names, with its part of the default cell."""
    section = README.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        keys = re.findall(r"`([^`]+)`", cells[0])
        # "`{}`, unset" has a part per key; prose ("same as `listen`") is one part
        parts = re.split(r",\s+(?=`|unset|random)", cells[1]) if len(keys) > 1 else [cells[1]]
        assert len(parts) == len(keys), f"README row {cells[0]}: {len(keys)} keys, defaults {cells[1]!r}"
        rows.update(zip(keys, parts, strict=True))
    return rows


def documented_default(cell: str) -> object:
    """A default written as a value (`5`, `true`, `{}`) is that value; prose (unset, random,
    same as `listen`, nothing) stands for a key with no default value (None)."""
    value = re.fullmatch(r"`([^`]*)`", cell)
    return yaml.safe_load(value.group(1)) if value else None


def config_defaults(model: type[BaseModel] = Settings, prefix: str = "") -> dict[str, object]:
    """Every leaf key of the configuration, dotted, with its default."""
    defaults: dict[str, object] = {}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            defaults.update(config_defaults(info.annotation, f"{prefix}{name}."))
        else:
            defaults[prefix + name] = info.get_default(call_default_factory=True)
    return defaults


def test_the_configuration_table_names_every_key_and_only_keys_that_exist():
    documented, actual = set(config_table()), set(config_defaults())
    assert not actual - documented, f"missing from the README configuration table: {sorted(actual - documented)}"
    assert not documented - actual, f"in the README configuration table, not settings: {sorted(documented - actual)}"


@pytest.mark.parametrize("key", sorted(config_defaults()))
def test_the_configuration_table_gives_each_keys_actual_default(key: str):
    cell = config_table().get(key)
    assert cell is not None, f"{key} is not in the README configuration table"
    assert documented_default(cell) == config_defaults()[key], f"README says {key} defaults to {cell}"
