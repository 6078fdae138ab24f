#!/usr/bin/env bash
# Starts the proxy at http://127.0.0.1:8080/mcp in front of a working example upstream: a
# modern-only (2026-07-28) MCP server built on mcp==2.3.0, on 127.0.0.1:3000. Point any
# legacy MCP client (e.g. one built on mcp 1.x) at the proxy. Ctrl-C stops both.
#   PROXY_LISTEN=127.0.0.1:8080 UPSTREAM_PORT=3000 bash scripts/demo.sh
. "$(dirname "$0")/lib.sh"
project_venv
peer_venv mcp2 "mcp==2.3.0"
UPSTREAM_PORT="${UPSTREAM_PORT:-3000}"
"$CACHE/venvs/mcp2/bin/python" "$REPO/tests/e2e/peers/modern_server.py" --port "$UPSTREAM_PORT" >&2 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$UPSTREAM_PORT") 2>/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "example upstream failed to start" >&2; exit 1; }
  sleep 0.1
done
"$REPO/.venv/bin/mcp-era-proxy" --upstream "http://127.0.0.1:$UPSTREAM_PORT/mcp" \
  --listen "${PROXY_LISTEN:-127.0.0.1:8080}" --log-format console "$@"
