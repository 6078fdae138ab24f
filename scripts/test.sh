#!/usr/bin/env bash
# The test suite from a fresh clone: creates .venv, installs what the tests need, lints, tests.
#
#   bash scripts/test.sh           everything (the README's test command, what .ci/run runs): ruff,
#                                  mypy, the documentation site's strict build, the core's coverage
#                                  gate, the deploy lint, the floors tier, then every test:
#                                  unit, hostile, integration, e2e against the real peers, the
#                                  conformance runs, the replica suite, the ops checks and the soak
#   bash scripts/test.sh --floors  the floors tier alone: the suites of tests/floors/suites.txt on the
#                                  lowest version of every runtime dependency pyproject.toml declares
#                                  (tests/floors/constraints.txt), in a virtualenv of their own
#   bash scripts/test.sh --quick   the inner loop: ruff, mypy, the site's build, the coverage gate,
#                                  and every test that starts no third-party peer (tests/unit,
#                                  tests/hostile, tests/integration and the repository checks in
#                                  tests/test_*.py)
#
# pytest runs the tests in parallel (pytest-xdist; the number of workers is in pyproject.toml).
# Further arguments go to pytest and, where they name tests, replace the tier's selection:
#   bash scripts/test.sh --quick -k sessions        bash scripts/test.sh tests/e2e/test_soak.py -n 0
. "$(dirname "$0")/lib.sh"
QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
# The floors tier: the suites that go through the dependencies' private parts (proxy/seams/) on the
# lowest versions pyproject.toml declares, so that its ranges are the ones the test command proves.
floors_suites() { grep -v '^#' "$REPO/tests/floors/suites.txt" | awk 'NF { print $1 }'; }
run_floors() {
  # shellcheck disable=SC2046  # one path a line
  (cd "$REPO" && "$CACHE/venvs/floors/bin/pytest" -q -p no:cacheprovider --no-header $(floors_suites))
}
if [ "${1:-}" = "--floors" ]; then
  shift
  floors_venv
  run_floors
  exit
fi
project_venv
# redis-server for the store's integration tests; HAProxy and Prometheus for the replica and ops suites.
bash "$REPO/scripts/setup-services.sh"
[ "$QUICK" -eq 1 ] || bash "$REPO/scripts/setup-peers.sh"
cd "$REPO"
# Byte code, compiled once beside the checks below rather than by every process of the run: each
# pytest process (the controller and every worker) imports every test module, rewriting its asserts
# (5 s of CPU apiece), and the tests start hundreds of Python processes (proxies, peers, taps) that
# import the proxy and tests/support. Cached in __pycache__ (.gitignore) even where
# PYTHONDONTWRITEBYTECODE is set, as in some CI images: there nothing would ever be cached, and
# every one of them would compile it all again. A collection error shows in the run itself.
(
  .venv/bin/python -m compileall -q proxy tests >/dev/null || true
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/pytest --collect-only -q -p no:cacheprovider -n 0 tests \
    >/dev/null 2>&1 || true
) &
byte_code=$!
trap 'kill "$byte_code" 2>/dev/null || true' EXIT
if [ "$QUICK" -eq 0 ]; then
  # The floors' virtualenv is made meanwhile (downloads, the first time: the checks below use the CPU).
  floors_log="$(mktemp)"
  floors_venv >"$floors_log" 2>&1 &
  floors_setup=$!
  # The deploy lint (helm, node and promtool processes, 40 s) runs beside the Python checks below,
  # which use one core; its report is printed after theirs, and a failure of it fails the run.
  deploy_report="$(mktemp)"
  LINT_DEPLOY_PYTEST=0 bash scripts/lint-deploy.sh >"$deploy_report" 2>&1 &
  deploy_lint=$!
  trap 'kill "$byte_code" "$deploy_lint" "$floors_setup" 2>/dev/null || true; rm -f "$deploy_report" "$floors_log"' EXIT
fi
.venv/bin/ruff check proxy tests scripts bench
.venv/bin/ruff format --check proxy tests scripts bench
.venv/bin/mypy  # strict, configured in pyproject.toml: 0 errors or the run fails
# The documentation site (mkdocs.yml, docs/): --strict makes a broken link or anchor, or a page left
# out of its nav, fail the run. Built into a temporary directory (a few seconds); tests/test_docs.py
# checks that its generated reference pages are current. NO_MKDOCS_2_WARNING: without it, the
# theme prints a notice about its successor on every build.
docs_site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$docs_site" \
  || { rm -rf "$docs_site"; exit 1; }
rm -rf "$docs_site"
# The pure core is driven by transcripts with no sockets: its branch coverage from its own unit
# tests alone must stay at least 95 % (pyproject.toml [tool.coverage]). One process: small, and
# coverage's parallel mode is not worth its start-up here.
.venv/bin/pytest -q -p no:cacheprovider -n 0 tests/unit/protocol --cov --cov-report=term --no-header

# Whether the arguments name tests (a path or node id): then they replace the tier's selection.
names_tests() {
  local arg
  for arg in "$@"; do
    case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && return 0 ;; esac
  done
  return 1
}
if [ "$QUICK" -eq 1 ]; then
  selection=(tests/unit tests/hostile tests/integration tests/test_architecture.py tests/test_docs.py
    tests/test_self_contained.py tests/test_image.py)
  names_tests "$@" && selection=()
  wait "$byte_code"
  trap - EXIT
  exec .venv/bin/pytest "${selection[@]}" "$@"
fi
# The deploy lint's own pytest step (the chart's rules and dashboard in a real Prometheus) is left
# to the run below, which holds those tests too.
deploy_status=0
wait "$deploy_lint" || deploy_status=$?
cat "$deploy_report"
[ "$deploy_status" -eq 0 ] || { echo "the deploy lint failed (exit $deploy_status)" >&2; exit "$deploy_status"; }
rm -f "$deploy_report"
floors_status=0
wait "$floors_setup" || floors_status=$?
cat "$floors_log"
rm -f "$floors_log"
[ "$floors_status" -eq 0 ] || { echo "the floors' virtualenv could not be made (exit $floors_status)" >&2; exit 1; }
names_tests "$@" || run_floors  # arguments that name tests replace the tiers' selections
wait "$byte_code"
trap - EXIT
exec .venv/bin/pytest "$@"
