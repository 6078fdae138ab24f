#!/usr/bin/env bash
# Installs the real services the replica suite (tests/replicas) runs: redis-server (7.0 on Debian 12)
# and HAProxy (2.6), Prometheus 2.42 with promtool (for the chart's alert rules and dashboard
# queries: tests/test_ops.py, tests/ops), and Chromium (headless, for the status page), from
# Debian's packages, only when missing. The
# tests start their own processes on loopback ports; the system services the packages bring are
# never started (and stopped at once if the package's own scripts started them).
# Idempotent: a second run only checks that all are in place.
. "$(dirname "$0")/lib.sh"
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v haproxy >/dev/null || missing+=(haproxy)
{ command -v prometheus && command -v promtool; } >/dev/null || missing+=(prometheus)  # ships both
# A real browser for the admin status page (tests/e2e/test_status_page.py), run headless.
command -v chromium >/dev/null || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[services] installing ${missing[*]} (Debian packages)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  # Recommends stay out (prometheus would bring node-exporter and its collectors); policy-rc.d
  # exit 101 forbids the packages' post-install scripts to start their services.
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e "$policy" ] && had_policy=1
  if [ "$had_policy" -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy"
  fi
  install() {
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  }
  install || { $SUDO apt-get update -qq >&2 && install; } || status=$?
  [ "$had_policy" -eq 1 ] || $SUDO rm -f "$policy"
  [ "${status:-0}" -eq 0 ] || { echo "cannot install ${missing[*]}" >&2; exit "$status"; }
  # Where no policy-rc.d is honoured (systemd running), stop what the packages may have started.
  for unit in redis-server haproxy prometheus; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$unit" 2>/dev/null; then
      $SUDO systemctl disable --now "$unit" >&2 || true
    fi
  done
fi
echo "services ready: $(redis-server --version | cut -d' ' -f3), $(haproxy -v | sed -n 1p | cut -d' ' -f1-3)," \
  "$(promtool --version 2>&1 | sed -n 1p | cut -d' ' -f1,3)," "$(chromium --version 2>/dev/null | cut -d' ' -f1,2)" >&2
