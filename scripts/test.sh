#!/usr/bin/env bash
# The test command of the README: lint, type-check, then the CPU test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
# `bash scripts/test.sh --slow-shard K/N [pytest arguments]` runs shard K of N of the
# slow tests (scripts/slow_shard.py): shards 1/N .. N/N together run every slow test once.
#
# With no arguments (CI's run, .ci/run) pytest runs every test not marked slow or gpu,
# plus today's shard of the slow ones (shard = day of the year mod SCOUT_SLOW_SHARDS,
# default 30, plus 1: every slow test runs in CI within that many days; the run prints
# its shard), and it also fails fast and reports:
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
shards=${SCOUT_SLOW_SHARDS:-30}
read -r -a selection <<<"${SCOUT_CI_TESTS:-}"
# Not SCOUT_<FIELD> configuration: keep them out of the tests' environment.
unset SCOUT_CI_BUDGET_S SCOUT_CI_TESTS SCOUT_SLOW_SHARDS
case "$budget" in
  '' | *[!0-9]* | 0)
    echo "SCOUT_CI_BUDGET_S must be a whole number of seconds above 0, got '$budget'" >&2
    exit 2
    ;;
esac
case "$shards" in
  '' | *[!0-9]* | 0)
    echo "SCOUT_SLOW_SHARDS must be a whole number above 0, got '$shards'" >&2
    exit 2
    ;;
esac
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
set +e
if [ "${1:-}" = "--slow-shard" ]; then
  if [ "$#" -lt 2 ]; then
    echo "--slow-shard takes K/N (e.g. 3/10)" >&2
    exit 2
  fi
  shard=$2
  shift 2
  .venv/bin/python -m pytest -m "slow and not gpu" -p scripts.slow_shard --slow-shard "$shard" \
    --durations=30 "$@"
elif [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@"
else
  today=$((10#$(date -u +%j) % shards + 1))
  # A backstop for the watchdog itself (a run whose Python never gets to its timer):
  # past the budget and the watchdog's 60 s of grace, timeout stops pytest.
  backstop=()
  if command -v timeout >/dev/null; then
    backstop=(timeout --foreground --kill-after=30 "$((budget + 120))")
  fi
  ${backstop[@]+"${backstop[@]}"} .venv/bin/python -m pytest -m "not gpu" \
    -p scripts.slow_shard --slow-shard "$today/$shards" \
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
