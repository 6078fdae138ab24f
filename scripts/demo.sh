#!/usr/bin/env bash
# Starts the proxy at http://127.0.0.1:8080/mcp in front of a working example upstream: a
# modern-only (2026-07-28) MCP server built on mcp==2.3.0, on 127.0.0.1:3000. Point any
# legacy MCP client (e.g. one built on mcp 1.x) at the proxy. Ctrl-C (or SIGTERM to this
# script) stops both.
#   PROXY_LISTEN=127.0.0.1:8080 UPSTREAM_PORT=3000 bash scripts/demo.sh
. "$(dirname "$0")/lib.sh"
project_venv
peer_venv mcp2 "mcp==2.3.0"
UPSTREAM_PORT="${UPSTREAM_PORT:-3000}"

listened() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Whatever already listens there would be taken for the example upstream: the proxy would start
# in front of a foreign server (the example's own bind fails a moment later, in its log only).
if listened "$UPSTREAM_PORT"; then
  echo "demo: 127.0.0.1:$UPSTREAM_PORT is already in use; choose a free port for the example upstream" \
    "with UPSTREAM_PORT=..." >&2
  exit 1
fi

# Children are stopped by PID (SIGTERM, then waited for: the proxy drains before it exits). The
# proxy runs in the background and the script waits for it, because bash runs a trap only once
# the foreground command has ended: a SIGTERM to the script would otherwise orphan it.
CHILDREN=()
stop_children() {
  trap - EXIT INT TERM
  local pid
  for pid in "${CHILDREN[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${CHILDREN[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_children EXIT
trap 'stop_children; exit 130' INT
trap 'stop_children; exit 143' TERM

"$CACHE/venvs/mcp2/bin/python" "$REPO/tests/e2e/peers/modern_server.py" --port "$UPSTREAM_PORT" >&2 &
SERVER=$!
CHILDREN+=("$SERVER")
for _ in $(seq 100); do
  kill -0 "$SERVER" 2>/dev/null || { echo "demo: the example upstream exited before listening" >&2; exit 1; }
  listened "$UPSTREAM_PORT" && break
  sleep 0.1
done
if ! kill -0 "$SERVER" 2>/dev/null || ! listened "$UPSTREAM_PORT"; then
  echo "demo: the example upstream is not listening on 127.0.0.1:$UPSTREAM_PORT" >&2
  exit 1
fi

"$REPO/.venv/bin/mcp-era-proxy" --upstream "http://127.0.0.1:$UPSTREAM_PORT/mcp" \
  --listen "${PROXY_LISTEN:-127.0.0.1:8080}" --log-format console "$@" &
PROXY=$!
CHILDREN+=("$PROXY")
wait "$PROXY"
