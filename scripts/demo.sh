#!/usr/bin/env bash
# Starts the proxy in front of a working example upstream: a modern-only (2026-07-28) MCP server
# built on mcp==2.3.0. Point any MCP client, legacy (one built on mcp 1.x) or 2026-07-28, at the
# URL it prints last, once the proxy itself listens there (an address another program holds is
# refused, saying so). Ctrl-C (or SIGTERM to this script) stops both.
#
#   bash scripts/demo.sh [--listen HOST:PORT] [--upstream-port PORT] [proxy flags...]
#
# --listen (or PROXY_LISTEN): where the proxy listens, default 127.0.0.1:8080.
# --upstream-port (or UPSTREAM_PORT): the example server's port on 127.0.0.1, default 3000.
# Other flags go to the proxy (`--log-level debug`, ...). The example server's output goes to
# $ERA_PROXY_TEST_CACHE/demo-upstream.log (default ~/.cache/mcp-era-proxy).
. "$(dirname "$0")/lib.sh"
LISTEN="${PROXY_LISTEN:-127.0.0.1:8080}"
UPSTREAM_PORT="${UPSTREAM_PORT:-3000}"
PROXY_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --listen) LISTEN="${2:?--listen needs HOST:PORT}"; shift 2 ;;
    --listen=*) LISTEN="${1#*=}"; shift ;;
    --upstream-port) UPSTREAM_PORT="${2:?--upstream-port needs a port}"; shift 2 ;;
    --upstream-port=*) UPSTREAM_PORT="${1#*=}"; shift ;;
    *) PROXY_ARGS+=("$1"); shift ;;
  esac
done
say() { echo "demo: $*" >&2; }

# Only what the demo runs: the proxy itself (not the test extras) and the example server's SDK.
project_venv_ready runtime || say "installing mcp-era-proxy into $REPO/.venv (first run only, about half a minute)"
project_venv runtime
[ -x "$CACHE/venvs/mcp2/bin/python" ] || say "installing the example server's SDK, mcp==2.3.0, into $CACHE/venvs/mcp2 (first run only)"
peer_venv mcp2 "mcp==2.3.0"

listened() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

# Whatever already listens there would be taken for the example upstream: the proxy would start
# in front of a foreign server (the example's own bind fails a moment later, in its log only).
if listened "$UPSTREAM_PORT"; then
  say "127.0.0.1:$UPSTREAM_PORT is already in use; choose a free port for the example upstream" \
    "with --upstream-port PORT (or UPSTREAM_PORT=...)"
  exit 1
fi
# The proxy's own address: another program there would answer in its place (the proxy itself
# fails with cannot_start). An address of every interface is reached on loopback.
PROXY_PORT="${LISTEN##*:}"
PROXY_HOST="${LISTEN%:*}"
PROXY_HOST="${PROXY_HOST#[}"
PROXY_HOST="${PROXY_HOST%]}"
case "$PROXY_HOST" in 0.0.0.0 | "" ) PROXY_HOST=127.0.0.1 ;; :: ) PROXY_HOST=::1 ;; esac
if listened "$PROXY_PORT" "$PROXY_HOST"; then
  say "$LISTEN is already in use by another program; choose a free address for the proxy" \
    "with --listen HOST:PORT (or PROXY_LISTEN=...)"
  exit 1
fi

# Children are stopped by PID (SIGTERM, then waited for: the proxy drains before it exits). The
# proxy runs in the background and the script waits for it, because bash runs a trap only once
# the foreground command has ended: a SIGTERM to the script would otherwise orphan it.
# The last started first: the proxy answers its calls in flight (its shutdown grace) while the
# example server still serves them, then the server stops.
CHILDREN=()
stop_children() {
  trap - EXIT INT TERM
  local i pid
  for ((i = ${#CHILDREN[@]} - 1; i >= 0; i--)); do
    pid="${CHILDREN[$i]}"
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_children EXIT
trap 'stop_children; exit 130' INT
trap 'stop_children; exit 143' TERM

# The example server in a session of its own: a terminal's Ctrl-C (SIGINT to the whole foreground
# group) does not reach it, the trap above stops it with SIGTERM, and nothing of it (its own
# "READY" line, a traceback) mixes with the demo's output.
UPSTREAM_LOG="$CACHE/demo-upstream.log"
mkdir -p "$CACHE"
setsid "$CACHE/venvs/mcp2/bin/python" "$REPO/tests/e2e/peers/modern_server.py" --port "$UPSTREAM_PORT" \
  > "$UPSTREAM_LOG" 2>&1 < /dev/null &
SERVER=$!
CHILDREN+=("$SERVER")
for _ in $(seq 100); do
  kill -0 "$SERVER" 2>/dev/null || break
  listened "$UPSTREAM_PORT" && break
  sleep 0.1
done
if ! kill -0 "$SERVER" 2>/dev/null || ! listened "$UPSTREAM_PORT"; then
  say "the example upstream is not listening on 127.0.0.1:$UPSTREAM_PORT; its log ($UPSTREAM_LOG) ends:"
  tail -n 20 "$UPSTREAM_LOG" >&2
  exit 1
fi

# A short shutdown grace: a Ctrl-C with a call in flight ends the demo in 2 s, not 20.
MCP_ERA_PROXY_SHUTDOWN__GRACE_S="${MCP_ERA_PROXY_SHUTDOWN__GRACE_S:-2}" \
  "$REPO/.venv/bin/mcp-era-proxy" --upstream "http://127.0.0.1:$UPSTREAM_PORT/mcp" \
  --listen "$LISTEN" --log-format console ${PROXY_ARGS[@]+"${PROXY_ARGS[@]}"} &
PROXY=$!
CHILDREN+=("$PROXY")

# Ready when the proxy's own socket listens on its port, not whatever else took the port since
# the check above: on Linux, the port's listening socket (/proc/net/tcp, tcp6) is one of the
# proxy's descriptors; without /proc, the port answers.
proxy_listens() {
  [ -r /proc/net/tcp ] || { listened "$PROXY_PORT" "$PROXY_HOST"; return; }
  local port descriptors inode
  port="$(printf '%04X' "$PROXY_PORT")"
  descriptors="$(ls -l "/proc/$PROXY/fd" 2>/dev/null)" || return 1
  # Each line: sl local_address(HEX_IP:HEX_PORT) rem_address st(0A: LISTEN) ... inode (10th).
  for inode in $(awk -v port=":$port" '$4 == "0A" && substr($2, length($2) - 4) == port { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    [[ "$descriptors" == *"socket:[$inode]"* ]] && return 0
  done
  return 1
}
for _ in $(seq 300); do
  kill -0 "$PROXY" 2>/dev/null || break
  proxy_listens && break
  sleep 0.1
done
if ! kill -0 "$PROXY" 2>/dev/null; then
  code=0
  wait "$PROXY" || code=$?
  say "the proxy did not start (exit $code): its own message above says why"
  exit 1
fi
if proxy_listens; then
  # Last and plain: the one thing to use.
  echo
  echo "Ready. Point an MCP client (legacy or 2026-07-28) at:  http://$LISTEN/mcp"
  echo "(the example server behind it: http://127.0.0.1:$UPSTREAM_PORT/mcp, 2026-07-28 only; Ctrl-C stops both)"
else
  say "the proxy is running but not listening on $LISTEN after 30 s: its log above says what it waits for"
fi
wait "$PROXY"
