#!/usr/bin/env bash
# The demo command of the README: install on first use, then run `scout demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/scout demo "$@"
