"""Helpers shared by the chart checks (scripts/check_*.py): the chart's values as Helm computes them,
and the proxy config its ConfigMap renders. Needs PyYAML only.

`compose_config` mirrors the "mcp-era-proxy.config" template in
helm/mcp-era-proxy/templates/_helpers.tpl: change both together.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "mcp-era-proxy"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))

# Release used to compose names (the allowed Host names depend on it).
RELEASE = "mcp-era-proxy"
NAMESPACE = "default"


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def defaults() -> dict[str, Any]:
    return load_yaml(CHART / "values.yaml")


def coalesce(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of user values over the chart's: maps merge key by key, anything else (lists
    included) is replaced, and a null removes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, effective values): each example over the defaults."""
    base = defaults()
    return [(f"examples/{path.name}", coalesce(base, load_yaml(path) or {})) for path in EXAMPLES]


def readme_cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, effective values): each YAML block of README.md's chart sections ("### The chart" up
    to "### Metrics") over the defaults, so the documented snippets stay valid values."""
    base = defaults()
    out, section, block, indent, start = [], None, None, 0, 0
    for number, line in enumerate((REPO / "README.md").read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## ") or line == "### Metrics":
            section = None  # past the chart sections
        elif line.startswith("### ") and (section or line == "### The chart"):
            section = line[4:]
        stripped = line.lstrip()
        if block is None and section and stripped == "```yaml":
            block, indent, start = [], len(line) - len(stripped), number
        elif block is not None and stripped == "```":
            values = yaml.safe_load("\n".join(block)) or {}
            out.append((f"README.md:{start} ({section})", coalesce(base, values)))
            block = None
        elif block is not None:
            block.append(line[indent:])
    return out


def chart_meta() -> dict[str, Any]:
    return load_yaml(CHART / "Chart.yaml")


def fullname(values: dict[str, Any], release: str = RELEASE) -> str:
    if values.get("fullnameOverride"):
        return values["fullnameOverride"][:63].rstrip("-")
    name = values.get("nameOverride") or chart_meta()["name"]
    if name in release:
        return release[:63].rstrip("-")
    return f"{release}-{name}"[:63].rstrip("-")


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allowed_hosts(values: dict[str, Any], namespace: str = NAMESPACE) -> list[str]:
    svc = fullname(values)
    hosts = [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local"]
    hosts += ["localhost", "127.0.0.1", "::1"]
    if values["ingress"]["enabled"]:
        for entry in values["ingress"]["hosts"]:
            host = entry.get("host")
            if host and host not in hosts:
                hosts.append(host)
    if values["httpRoute"]["enabled"]:
        hosts += [host for host in values["httpRoute"]["hostnames"] if host not in hosts]
    return hosts


def compose_config(values: dict[str, Any]) -> dict[str, Any]:
    """The proxy config the ConfigMap renders: `config` plus the keys the chart computes."""
    cfg = copy.deepcopy(values.get("config") or {})
    cfg["listen"] = address(values["listenAddress"], values["containerPorts"]["http"])
    cfg["admin_listen"] = address(values["listenAddress"], values["containerPorts"]["admin"])
    security = cfg.get("security") or {}
    if "allowed_hosts" not in security:
        security["allowed_hosts"] = allowed_hosts(values)
    cfg["security"] = security
    shutdown = cfg.get("shutdown") or {}
    shutdown.setdefault("grace_s", 20)
    cfg["shutdown"] = shutdown
    if has_store(values):
        store = cfg.get("store") or {}
        store.setdefault("namespace", values["store"]["namespace"])
        store.setdefault("timeout_ms", values["store"]["timeoutMs"])
        cfg["store"] = store
    if values["mode"] == "sidecar":
        upstream = cfg.get("upstream") or {}
        sidecar = values["sidecar"]
        upstream["url"] = f"http://127.0.0.1:{sidecar['upstreamPort']}{sidecar['upstreamPath']}"
        cfg["upstream"] = upstream
    return cfg


def has_store(values: dict[str, Any]) -> bool:
    return bool(values["store"].get("existingSecret"))


def has_session_secret(values: dict[str, Any]) -> bool:
    secret = values["sessionSecret"]
    return bool(secret.get("existingSecret") or secret.get("create"))
