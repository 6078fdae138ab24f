#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone: creates .venv, installs the peers, lints, tests.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
. "$(dirname "$0")/lib.sh"
project_venv
bash "$REPO/scripts/setup-peers.sh"
bash "$REPO/scripts/setup-services.sh"  # redis-server and HAProxy for tests/replicas
cd "$REPO"
.venv/bin/ruff check proxy tests scripts bench
.venv/bin/ruff format --check proxy tests scripts bench
.venv/bin/mypy  # strict, configured in pyproject.toml: 0 errors or the run fails
# The pure core is driven by transcripts with no sockets: its branch coverage from its own unit
# tests alone must stay at least 95 % (pyproject.toml [tool.coverage]).
.venv/bin/pytest -q -p no:cacheprovider tests/unit/protocol --cov --cov-report=term --no-header
bash scripts/lint-deploy.sh && exec .venv/bin/pytest "$@"
