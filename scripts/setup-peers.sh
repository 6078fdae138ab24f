#!/usr/bin/env bash
# Installs the third-party peers the end-to-end tests and benchmarks talk to:
#   - the pinned npm peers and the official conformance runner (from the shared folder),
#   - mcp==1.30.0 (legacy-only) and mcp==2.3.0 (dual-era) in their own test-only virtualenvs.
# Idempotent: a second run only checks that everything is in place.
. "$(dirname "$0")/lib.sh"
SHARED="$(shared_dir)"
export MCP_PEERS_HOME="${MCP_PEERS_HOME:-$HOME/.cache/mcp-test-peers}"
bash "$SHARED/peers/install.sh" "$MCP_PEERS_HOME" >/dev/null
peer_venv mcp1 "mcp==1.30.0"
peer_venv mcp2 "mcp==2.3.0"
echo "peers ready: npm peers in $MCP_PEERS_HOME, SDK virtualenvs in $CACHE/venvs" >&2
