#!/usr/bin/env bash
# The test command of the README: lint, type-check, then the CPU test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
#
# With no arguments (CI's run, .ci/run) pytest also fails fast and reports:
#   --maxfail=3             stop at the third failing test;
#   .ci-reports/junit.xml   JUnit XML of every test that ran;
#   SCOUT_CI_BUDGET_S       the whole pytest run's wall-clock budget in seconds (default
#                           4800, under CI's 90 min with bootstrap, lint and mypy on top):
#                           past it scripts/ci_watchdog.py prints the slowest tests so far,
#                           kills what the run started and the script exits 124;
#   SCOUT_CI_TESTS          the tests to run instead of the whole suite (paths or node
#                           ids, separated by spaces), with the same options.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${SCOUT_CI_BUDGET_S:-4800}
read -r -a selection <<<"${SCOUT_CI_TESTS:-}"
# Not SCOUT_<FIELD> configuration: keep them out of the tests' environment.
unset SCOUT_CI_BUDGET_S SCOUT_CI_TESTS
case "$budget" in
  '' | *[!0-9]* | 0)
    echo "SCOUT_CI_BUDGET_S must be a whole number of seconds above 0, got '$budget'" >&2
    exit 2
    ;;
esac
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
set +e
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@"
else
  # A backstop for the watchdog itself (a run whose Python never gets to its timer):
  # past the budget and the watchdog's 60 s of grace, timeout stops pytest.
  backstop=()
  if command -v timeout >/dev/null; then
    backstop=(timeout --foreground --kill-after=30 "$((budget + 120))")
  fi
  ${backstop[@]+"${backstop[@]}"} .venv/bin/python -m pytest -m "not slow and not gpu" \
    --durations=30 --maxfail=3 --junitxml=.ci-reports/junit.xml \
    -p scripts.ci_watchdog --ci-budget-s "$budget" ${selection[@]+"${selection[@]}"}
fi
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests (exit 5): treated as a failure, a suite must test something" >&2
  exit 1
fi
if [ "$#" -eq 0 ] && [ "$code" -eq 124 ]; then
  echo "scout tests: stopped, the budget of ${budget} s (SCOUT_CI_BUDGET_S) is spent;" \
    "the slowest tests so far are listed above (JUnit XML: .ci-reports/junit.xml)" >&2
fi
exit "$code"
