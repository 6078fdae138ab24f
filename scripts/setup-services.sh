#!/usr/bin/env bash
# The real services the tests run against on loopback: redis-server (the shared store) and HAProxy
# (a round-robin balancer in front of replicas). Installed from Debian's packages when missing;
# the tests start and stop their own instances (never a system service).
. "$(dirname "$0")/lib.sh"
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[setup-services] installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi
