#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone: creates .venv, installs the peers, lints, tests.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
. "$(dirname "$0")/lib.sh"
project_venv
bash "$REPO/scripts/setup-peers.sh"
export MCP_SPEC_DIR="${MCP_SPEC_DIR:-$(shared_dir)/spec}"
cd "$REPO"
.venv/bin/ruff check proxy tests scripts bench
.venv/bin/ruff format --check proxy tests scripts bench
.venv/bin/mypy  # strict, configured in pyproject.toml: 0 errors or the run fails
bash scripts/lint-deploy.sh && exec .venv/bin/pytest "$@"
