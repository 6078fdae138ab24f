# Shared by the scripts in this folder: where things live, and the project virtualenv.
# Sourced, not run.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Test-only virtualenvs and tools. Not named MCP_ERA_PROXY_*: the proxy reads every variable with
# that prefix as its configuration (MCP_ERA_PROXY_CACHE would be its `cache` section).
CACHE="${ERA_PROXY_TEST_CACHE:-$HOME/.cache/mcp-era-proxy}"
PYTHON="${PYTHON:-python3}"

# The project's own virtualenv (.venv), with the test extras; created on first use.
project_venv() {
  if [ ! -x "$REPO/.venv/bin/python" ]; then
    "$PYTHON" -m venv "$REPO/.venv"
    "$REPO/.venv/bin/pip" install -q --upgrade pip >&2
  fi
  if ! cmp -s "$REPO/pyproject.toml" "$REPO/.venv/.installed-pyproject" 2>/dev/null; then
    "$REPO/.venv/bin/pip" install -q -e "$REPO[dev]" >&2
    cp "$REPO/pyproject.toml" "$REPO/.venv/.installed-pyproject"
  fi
}

# A test- or tool-only virtualenv ($CACHE/venvs/<name>) holding pinned PyPI packages (never a
# project dependency); rebuilt when the pinned set changes.
peer_venv() {  # name "requirement [requirement ...]"
  local dir="$CACHE/venvs/$1"
  if [ ! -x "$dir/bin/python" ] || [ "$(cat "$dir/.requirement" 2>/dev/null)" != "$2" ]; then
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    # shellcheck disable=SC2086  # a list of requirement specs, split on purpose
    if ! { "$dir/bin/pip" install -q --upgrade pip && "$dir/bin/pip" install -q $2; } >"$dir.log" 2>&1; then
      cat "$dir.log" >&2; echo "cannot install $2" >&2; return 1
    fi
    echo "$2" > "$dir/.requirement"
  fi
}
