#!/usr/bin/env bash
# The benchmark, in one command:   bash bench/run.sh [--duration S] [--only a,b,c,...] [--profile]
# Installs what it needs (project .venv with the `bench` extra, the npm peers, wrk), runs every
# scenario on 127.0.0.1, writes bench/results/latest.md and latest.png and prints the table.
# Everything it starts runs in its own process group and is killed on exit (see cleanup).
# bench/workers.sh runs another harness (BENCH_HARNESS) with the same set-up and clean-up.
. "$(dirname "$0")/../scripts/lib.sh"
cd "$REPO"
RESULTS="$REPO/bench/results"
PIDS="$RESULTS/.pids"
mkdir -p "$RESULTS"
HARNESS=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$HARNESS" ] && kill -0 "$HARNESS" 2>/dev/null; then
    kill -TERM "$HARNESS" 2>/dev/null || true        # the harness stops its children itself
    for _ in $(seq 50); do kill -0 "$HARNESS" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$HARNESS" 2>/dev/null || true
  fi
  if [ -s "$PIDS" ]; then                            # whatever it could not stop: by group id
    while read -r pgid; do
      [ -n "$pgid" ] && kill -TERM -- "-$pgid" 2>/dev/null || true
    done < "$PIDS"
    sleep 1
    while read -r pgid; do
      [ -n "$pgid" ] && kill -KILL -- "-$pgid" 2>/dev/null || true
    done < "$PIDS"
    : > "$PIDS"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "[bench] project venv" >&2
project_venv
if ! cmp -s "$REPO/pyproject.toml" "$REPO/.venv/.installed-bench" 2>/dev/null; then
  "$REPO/.venv/bin/pip" install -q -e "$REPO[dev,bench]" >&2
  cp "$REPO/pyproject.toml" "$REPO/.venv/.installed-bench"
fi

echo "[bench] peers" >&2
bash "$REPO/scripts/setup-peers.sh"
export MCP_PEERS_HOME="${MCP_PEERS_HOME:-$HOME/.cache/mcp-test-peers}"
# Bench-only tools from PyPI, each in its own virtualenv (never a project dependency):
# sparfenyuk's mcp-proxy, a stdio-to-HTTP bridge that bench/stdio_bridge.py measures.
peer_venv bench-mcp-proxy "mcp-proxy==0.13.0"

if ! command -v wrk >/dev/null; then
  echo "[bench] installing wrk" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  $SUDO apt-get install -y -qq wrk >&2
fi

"$REPO/.venv/bin/python" -m "${BENCH_HARNESS:-bench.run}" "$@" &
HARNESS=$!
wait "$HARNESS"
