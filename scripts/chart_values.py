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


CHART_PAGE = REPO / "docs" / "operate" / "kubernetes.md"


def documented_cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, effective values): each YAML block of the chart's documentation page
    (docs/operate/kubernetes.md: every one is chart values) over the defaults, so the documented
    snippets stay valid values."""
    base = defaults()
    out, section, block, indent, start = [], "", None, 0, 0
    name = CHART_PAGE.relative_to(REPO).as_posix()
    for number, line in enumerate(CHART_PAGE.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            section = line[3:]
        stripped = line.lstrip()
        if block is None and stripped == "```yaml":
            block, indent, start = [], len(line) - len(stripped), number
        elif block is not None and stripped == "```":
            values = yaml.safe_load("\n".join(block)) or {}
            out.append((f"{name}:{start} ({section})", coalesce(base, values)))
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
    auth = cfg.get("auth") or {}
    chart_auth = values["auth"]
    computed = {
        "mode": chart_auth["mode"],
        "public_url": public_url(values),
        "issuers": chart_auth["issuers"],
        "audience": chart_auth["audience"],
        "jwks_url": chart_auth["jwksUrl"],
        "required_scopes": chart_auth["requiredScopes"],
        "client_in_identity": chart_auth["clientInIdentity"],
        "metadata_max_age_s": chart_auth["metadataMaxAgeS"],
    }
    for key, value in computed.items():
        # Empty strings and lists are left out (the proxy's default); booleans and numbers never are.
        if key not in auth and (isinstance(value, bool | int | float) or value):
            auth[key] = value
    cfg["auth"] = auth
    if values["mode"] == "sidecar":
        upstream = cfg.get("upstream") or {}
        sidecar = values["sidecar"]
        upstream["url"] = f"http://127.0.0.1:{sidecar['upstreamPort']}{sidecar['upstreamPath']}"
        cfg["upstream"] = upstream
    return cfg


def public_url(values: dict[str, Any]) -> str:
    """auth.public_url as the chart computes it ("mcp-era-proxy.publicUrl"): auth.publicUrl, else
    the first ingress host (https when ingress.tls names it), else the first HTTPRoute hostname
    (https), with config.path; empty with neither."""
    path = (values.get("config") or {}).get("path", "/mcp")
    if values["auth"]["publicUrl"]:
        return str(values["auth"]["publicUrl"])
    ingress = values["ingress"]
    if ingress["enabled"] and ingress["hosts"] and ingress["hosts"][0].get("host"):
        host = ingress["hosts"][0]["host"]
        tls = any(host in (entry.get("hosts") or []) for entry in ingress["tls"])
        return f"{'https' if tls else 'http'}://{host}{path}"
    route = values["httpRoute"]
    if route["enabled"] and route["hostnames"]:
        return f"https://{route['hostnames'][0]}{path}"
    return ""


def has_store(values: dict[str, Any]) -> bool:
    return bool(values["store"].get("existingSecret"))


def has_session_secret(values: dict[str, Any]) -> bool:
    secret = values["sessionSecret"]
    return bool(secret.get("existingSecret") or secret.get("create"))
