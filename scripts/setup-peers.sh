#!/usr/bin/env bash
# Installs the third-party peers the end-to-end tests and benchmarks talk to:
#   - the npm peers and the official conformance runner, pinned in tests/peers (package-lock.json),
#     with the project's conformance fixture, into $MCP_PEERS_HOME (npm ci; the clone stays clean),
#   - mcp==1.30.0 (legacy-only) and mcp==2.3.0 (dual-era) in their own test-only virtualenvs,
#   - for the tracing e2e, mcp==2.3.0 with the OpenTelemetry SDK, and the Phoenix OTLP receiver.
# Idempotent: a second run only checks that everything is in place.
. "$(dirname "$0")/lib.sh"
SRC="$REPO/tests/peers"
export MCP_PEERS_HOME="${MCP_PEERS_HOME:-$HOME/.cache/mcp-test-peers}"
mkdir -p "$MCP_PEERS_HOME/fixtures"
for f in package.json package-lock.json env.sh peer.sh loopback-only.cjs; do cp "$SRC/$f" "$MCP_PEERS_HOME/$f"; done
cp "$SRC"/fixtures/*.mjs "$MCP_PEERS_HOME/fixtures/"
# The skills the Skills server serves: a fresh copy, so a skill removed here is gone there too.
rm -rf "$MCP_PEERS_HOME/fixtures/skills" && cp -r "$SRC/fixtures/skills" "$MCP_PEERS_HOME/fixtures/skills"
chmod +x "$MCP_PEERS_HOME/peer.sh" "$MCP_PEERS_HOME/env.sh"
# npm rewrites node_modules/.package-lock.json in its own shape, so remember the lock file's hash.
want=$(sha256sum "$SRC/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$MCP_PEERS_HOME/node_modules/.installed-lock-sha256" 2>/dev/null)" != "$want" ]; then
  if ! command -v npm >/dev/null; then  # the peers bring their own Node 22; npm only installs them
    echo "[peers] installing npm (Debian package)" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >&2
    $SUDO apt-get install -y -qq npm >&2
  fi
  (cd "$MCP_PEERS_HOME" && npm ci --no-audit --no-fund --loglevel=error >&2)
  echo "$want" > "$MCP_PEERS_HOME/node_modules/.installed-lock-sha256"
fi
peer_venv mcp1 "mcp==1.30.0"
peer_venv mcp2 "mcp==2.3.0"
# Tracing e2e: the mcp 2.3 server exporting its own spans (the SDK and exporter at the version the
# [otel] extra resolves to), and Arize Phoenix, a real OTLP/HTTP receiver with a REST API to read
# the spans back (Jaeger and the collector are not on PyPI, Debian or npm).
peer_venv mcp2otel "mcp==2.3.0 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2"
peer_venv phoenix "arize-phoenix==20.26.1"
echo "peers ready: npm peers in $MCP_PEERS_HOME, SDK virtualenvs in $CACHE/venvs" >&2
