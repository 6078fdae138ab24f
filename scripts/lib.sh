# Shared by the scripts in this folder: where things live, and the project virtualenv.
# Sourced, not run.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Test-only virtualenvs and tools. Not named MCP_ERA_PROXY_*: the proxy reads every variable with
# that prefix as its configuration (MCP_ERA_PROXY_CACHE would be its `cache` section).
CACHE="${ERA_PROXY_TEST_CACHE:-$HOME/.cache/mcp-era-proxy}"
PYTHON="${PYTHON:-python3}"

# The project's own virtualenv (.venv); created on first use. With the test extras by default;
# `project_venv runtime` installs only what the proxy itself needs (the demo), and a later call
# that wants the extras adds them.
project_venv() {  # [runtime]
  local want="${1:-dev}" spec="$REPO[dev]"
  [ "$want" = runtime ] && spec="$REPO"
  if [ ! -x "$REPO/.venv/bin/python" ]; then
    "$PYTHON" -m venv "$REPO/.venv"
    "$REPO/.venv/bin/pip" install -q --upgrade pip >&2
  fi
  # Installed for this pyproject.toml, with at least what is wanted (dev includes runtime)?
  local installed
  installed="$(cat "$REPO/.venv/.installed-extras" 2>/dev/null || true)"
  if ! cmp -s "$REPO/pyproject.toml" "$REPO/.venv/.installed-pyproject" 2>/dev/null \
     || { [ "$want" = dev ] && [ "$installed" != dev ]; }; then
    [ "$installed" = dev ] && [ "$want" = runtime ] && spec="$REPO[dev]" && want=dev  # keep the extras
    "$REPO/.venv/bin/pip" install -q -e "$spec" >&2
    cp "$REPO/pyproject.toml" "$REPO/.venv/.installed-pyproject"
    echo "$want" > "$REPO/.venv/.installed-extras"
  fi
}

# Whether project_venv has anything to install (the demo says so before the wait).
project_venv_ready() {  # [runtime]
  local want="${1:-dev}" installed
  installed="$(cat "$REPO/.venv/.installed-extras" 2>/dev/null || true)"
  [ -x "$REPO/.venv/bin/python" ] && cmp -s "$REPO/pyproject.toml" "$REPO/.venv/.installed-pyproject" 2>/dev/null \
    && { [ "$want" = runtime ] || [ "$installed" = dev ]; }
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

# The floors tier's virtualenv ($CACHE/venvs/floors): the proxy with the lowest version of every
# runtime dependency pyproject.toml declares (tests/floors/constraints.txt) and the newest test
# tools; rebuilt when either file changes. The proxy itself is installed editable from this clone.
floors_venv() {
  local dir="$CACHE/venvs/floors" key
  key="$(cat "$REPO/pyproject.toml" "$REPO/tests/floors/constraints.txt" | sha256sum | cut -c1-16)"
  if [ ! -x "$dir/bin/python" ] || [ "$(cat "$dir/.key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    if ! { "$dir/bin/pip" install -q --upgrade pip \
        && "$dir/bin/pip" install -q -c "$REPO/tests/floors/constraints.txt" -e "$REPO[test]"; } >"$dir.log" 2>&1; then
      cat "$dir.log" >&2; echo "cannot install the floors (tests/floors/constraints.txt)" >&2; return 1
    fi
    echo "$key" > "$dir/.key"
    echo "$REPO" > "$dir/.clone"
  elif [ "$(cat "$dir/.clone" 2>/dev/null)" != "$REPO" ]; then  # another clone: the proxy from this one
    "$dir/bin/pip" install -q --no-deps -e "$REPO" >"$dir.log" 2>&1 || { cat "$dir.log" >&2; return 1; }
    echo "$REPO" > "$dir/.clone"
  fi
}
