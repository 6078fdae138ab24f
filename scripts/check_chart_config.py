"""The proxy accepts the config the chart renders, and the chart agrees with the proxy it deploys.

For the chart defaults (with an upstream URL, which they leave to the user) and each
helm/mcp-era-proxy/examples/*.yaml: compose the config exactly as templates/configmap.yaml does
(values `config` plus the computed listen, admin_listen, allowed_hosts, shutdown.grace_s, the auth
values, with a store its namespace and timeout_ms, and, in sidecar mode, upstream.url), write it to a temp file and run
`python -m proxy --config FILE [extraArgs] --check-config` with the environment the pod would have
(MCP_ERA_PROXY_SECURITY__SECRET when a session secret is configured; with a store its URL and the
internal listener and advertised address the Deployment computes; literal MCP_ERA_PROXY_*
extraEnv), which must exit 0. Then, the chart's constants against the proxy's: the proxy config
sections the schema allows, the defaults the templates assume, and the version.

Run with the project's interpreter (it imports `proxy`): .venv/bin/python scripts/check_chart_config.py
With `--rendered DIR` (DIR/<example>.yaml from `helm template mcp-era-proxy ... -f examples/<example>.yaml`)
it checks instead that Helm rendered the same config as the composition above (scripts/lint-deploy.sh
does this when a helm binary is available).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from chart_values import (
    CHART,
    REPO,
    address,
    cases,
    chart_meta,
    coalesce,
    compose_config,
    defaults,
    has_session_secret,
    has_store,
)

sys.path.insert(0, str(REPO))
import proxy
from proxy.config import ENV_PREFIX, Settings

PLACEHOLDER_SECRET = "chart-check-placeholder-secret-0123456789"
PLACEHOLDER_STORE = "redis://chart-check-placeholder:6379/0"
PLACEHOLDER_POD_IP = {False: "10.0.0.1", True: "fd00::1"}


def pod_environment(values: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The environment of the check: ours without MCP_ERA_PROXY_*, plus what the pod gets."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = str(REPO)  # this work tree's proxy, whatever the interpreter has installed
    notes = []
    if has_session_secret(values):
        env[f"{ENV_PREFIX}SECURITY__SECRET"] = values["sessionSecret"].get("value") or PLACEHOLDER_SECRET
    if has_store(values):
        # As the Deployment renders them: the URL from its Secret, the internal listener on the pod IP.
        port = values["replicas"]["internalPort"]
        env[f"{ENV_PREFIX}STORE__URL"] = PLACEHOLDER_STORE
        env[f"{ENV_PREFIX}REPLICAS__INTERNAL_LISTEN"] = address(values["listenAddress"], port)
        env[f"{ENV_PREFIX}REPLICAS__ADVERTISE"] = address(PLACEHOLDER_POD_IP[":" in values["listenAddress"]], port)
    for var in values.get("extraEnv") or []:
        name = var.get("name", "")
        if not name.upper().startswith(ENV_PREFIX):
            continue
        if "value" in var:
            env[name] = str(var["value"])
        else:
            notes.append(f"{name} comes from valueFrom: not checked")
    return env, notes


def check_case(name: str, values: dict[str, Any]) -> bool:
    config = compose_config(values)
    env, notes = pod_environment(values)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")
        argv = [sys.executable, "-m", "proxy", "--config", str(path), *values.get("extraArgs", []), "--check-config"]
        result = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
    ok = result.returncode == 0
    effective: dict[str, Any] = {}
    if ok:
        effective = json.loads(result.stdout)
        # The ports the probes and the Service use are the ones the proxy will bind.
        ports = values["containerPorts"]
        for key, port in (("listen", ports["http"]), ("admin_listen", ports["admin"])):
            if not str(effective.get(key, "")).endswith(f":{port}"):
                ok = False
                notes.append(f"effective {key} is {effective.get(key)!r}, not on port {port}")
    print(f"{'ok  ' if ok else 'FAIL'} proxy --check-config: {name}")
    if not ok:
        print(f"       exit {result.returncode}: {(result.stderr or result.stdout).strip()}")
        print(
            "       rendered config:\n" + "\n".join("         " + line for line in yaml.safe_dump(config).splitlines())
        )
    for note in notes:
        print(f"       note: {note}")
    return ok


def field_default(model: type, *path: str) -> Any:
    for key in path[:-1]:
        model = model.model_fields[key].annotation
    return model.model_fields[path[-1]].default


def check_constants() -> bool:
    failed = []
    # Sections of the proxy config the schema allows under `config` = the proxy's settings.
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    allowed = set(schema["properties"]["config"]["properties"])
    settings = set(Settings.model_fields)
    if allowed != settings:
        failed.append(
            f"values.schema.json config keys differ from proxy Settings: only in schema {sorted(allowed - settings)}, "
            f"only in the proxy {sorted(settings - allowed)}"
        )
    # Defaults the templates assume when `config` leaves a key out.
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    assumed = {
        ("shutdown", "grace_s"): r'dig "shutdown" "grace_s" (\d+(?:\.\d+)?)',
        ("readiness", "probe_timeout_s"): r'dig "readiness" "probe_timeout_s" (\d+(?:\.\d+)?)',
        ("upstream", "shutdown_grace_s"): r'dig "shutdown_grace_s" (\d+(?:\.\d+)?)',
        ("sessions", "max_sessions"): r'dig "sessions" "max_sessions" (\d+)',
        ("input", "max_parked"): r'dig "input" "max_parked" (\d+)',
    }
    for path, pattern in assumed.items():
        found = re.findall(pattern, helpers)
        actual = field_default(Settings, *path)
        if not found or any(float(value) != float(actual) for value in found):
            failed.append(
                f"_helpers.tpl assumes {'.'.join(path)} = {found or 'nothing'}, the proxy's default is {actual}"
            )
    # The chart's store defaults are the proxy's own.
    chart_store = defaults()["store"]
    for key, field in (("namespace", "namespace"), ("timeoutMs", "timeout_ms")):
        if chart_store[key] != field_default(Settings, "store", field):
            failed.append(
                f"values.yaml store.{key} is {chart_store[key]!r}, the proxy's store.{field} default is "
                f"{field_default(Settings, 'store', field)!r}"
            )
    # The chart's auth defaults are the proxy's own.
    chart_auth = defaults()["auth"]
    for key, field in (
        ("mode", "mode"),
        ("clientInIdentity", "client_in_identity"),
        ("metadataMaxAgeS", "metadata_max_age_s"),
    ):
        if chart_auth[key] != field_default(Settings, "auth", field):
            failed.append(
                f"values.yaml auth.{key} is {chart_auth[key]!r}, the proxy's auth.{field} default is "
                f"{field_default(Settings, 'auth', field)!r}"
            )
    computed_grace = re.findall(r'set \$shutdown "grace_s" (\d+(?:\.\d+)?)', helpers)
    if [float(v) for v in computed_grace] != [float(field_default(Settings, "shutdown", "grace_s"))]:
        failed.append(f"_helpers.tpl renders shutdown.grace_s {computed_grace}, not the proxy's default")
    # One version: the proxy, the chart's appVersion, the image label.
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    image_version = re.search(r"^ARG VERSION=(\S+)$", dockerfile, re.MULTILINE)
    versions = {
        "proxy.__version__": proxy.__version__,
        "Chart.yaml appVersion": str(chart_meta()["appVersion"]),
        "Dockerfile ARG VERSION": image_version.group(1) if image_version else None,
    }
    if len(set(versions.values())) != 1:
        failed.append(f"versions differ: {versions}")
    for problem in failed:
        print(f"FAIL {problem}")
    if not failed:
        print(
            f"ok   chart constants: config sections = proxy Settings; assumed defaults match the proxy; "
            f"version {proxy.__version__} everywhere"
        )
    return not failed


def check_rendered(directory: Path) -> bool:
    """`helm template mcp-era-proxy CHART -f examples/X.yaml > DIR/X.yaml` rendered the same config as
    compose_config (the mirror this script checks the proxy against)."""
    ok = True
    for name, values in cases():
        rendered = directory / Path(name).name
        docs = [d for d in yaml.safe_load_all(rendered.read_text(encoding="utf-8")) if d]
        # The proxy's config map (the dashboards' ConfigMap, when enabled, holds no config.yaml).
        maps = [d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in (d.get("data") or {})]
        same = len(maps) == 1 and yaml.safe_load(maps[0]["data"]["config.yaml"]) == compose_config(values)
        print(f"{'ok  ' if same else 'FAIL'} helm-rendered config = the config checked above: {name}")
        ok &= same
    return ok


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rendered"] and len(argv) == 2:
        return 0 if check_rendered(Path(argv[1])) else 1
    base = coalesce(defaults(), {"config": {"upstream": {"url": "http://upstream:3000/mcp"}}})
    results = [check_case("values.yaml defaults (+ config.upstream.url)", base)]
    results += [check_case(name, values) for name, values in cases()]
    results.append(check_constants())
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
