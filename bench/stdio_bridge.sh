#!/usr/bin/env bash
# The stdio bridges, in one run:   bash bench/stdio_bridge.sh [--calls N] [--runs R] [--only KEY,...]
# The same set-up and clean-up as bench/run.sh (venv, npm peers incl. mcp-remote, the bench-only
# mcp-proxy virtualenv); runs bench/stdio_bridge.py, writes bench/results/stdio-bridge.md, prints it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
BENCH_HARNESS=bench.stdio_bridge exec bash "$here/run.sh" "$@"
