#!/usr/bin/env bash
# --workers 2 against one worker, in one run:   bash bench/workers.sh [--duration S] [--repeat N]
# The same set-up and clean-up as bench/run.sh (venv, peers, wrk), plus redis-server for the store
# (scripts/setup-services.sh); writes bench/results/workers.md and prints it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/../scripts/setup-services.sh"
BENCH_HARNESS=bench.workers exec bash "$here/run.sh" "$@"
