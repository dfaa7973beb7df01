#!/usr/bin/env bash
# The test command of the README: lint, type-check, then the CPU test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
set +e
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@"
else
  .venv/bin/python -m pytest -m "not slow and not gpu" --durations=30
fi
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests (exit 5): treated as a failure, a suite must test something" >&2
  exit 1
fi
exit "$code"
