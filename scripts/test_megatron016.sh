#!/usr/bin/env bash
# The megatron-core 0.16 smoke set: the project's .venv runs megatron-core 0.19.2 on
# Python 3.12 (scripts/bootstrap.sh); this keeps the plugin's oldest supported range true.
# Builds .venv-mcore016 (once: Python 3.11 found as `python3.11` or in pyenv's versions,
# torch 2.13.0's CPU wheel on this disk, megatron-core 0.16.1, Megatron-Bridge 0.3.1 without
# dependencies, the core and scout-megatron, with pip) and runs the version and probe
# tests, Bridge 0.3.1's callback contract, the plugin's activation tests and the example's
# SDC and hang runs. Extra arguments go to pytest; `--build-only` builds the environment
# and runs nothing (.ci/run builds it while the main suite runs). Called by .ci/run after
# the main tests;
# prints one line and exits 0 where no Python 3.11 exists, or where .venv is itself on
# Python 3.11 (bootstrap's fallback, which already runs every test on 0.16.1).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pyenv_lib.sh
. scripts/pyenv_lib.sh
say() { echo "scout megatron 0.16: $*" >&2; }

if ! PY=$(find_python 3.11); then
  say "no Python 3.11 here: the megatron-core 0.16 smoke set is not run"
  exit 0
fi
if [ -x .venv/bin/python ] && [ "$(pyver .venv/bin/python)" \< 3.12 ]; then
  say ".venv is on Python < 3.12 with megatron-core 0.16.1: its full suite covers this set"
  exit 0
fi
env_dir=.venv-mcore016
stamp=$env_dir/.scout-bootstrap
want="$(cat pyproject.toml plugins/megatron/pyproject.toml scripts/test_megatron016.sh scripts/pyenv_lib.sh scripts/constraints-dev.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  rm -rf "$env_dir"
  say "creating $env_dir with $("$PY" --version 2>&1) ($PY)"
  "$PY" -m venv "$env_dir"
  installer "$env_dir" pip # pip takes the CPU torch wheel on this disk
  say "installing torch==2.13.0 (CPU), megatron-core 0.16.1, Megatron-Bridge 0.3.1"
  "${install[@]}" "torch==2.13.0" psutil -c scripts/constraints-dev.txt \
    -e ".[dev]" -e plugins/megatron "megatron-core==0.16.1"
  "${install[@]}" --no-deps "megatron-bridge==0.3.1"
  echo "$want" >"$stamp"
fi
if [ "${1:-}" = "--build-only" ]; then
  say "$env_dir is ready"
  exit 0
fi
t=plugins/megatron/tests
say "running the smoke set on $("$env_dir/bin/python" --version 2>&1)"
"$env_dir/bin/python" -m pytest -q -p no:cacheprovider --durations=5 \
  "$t/test_megatron_versions.py" "$t/test_megatron_bridge.py" "$t/test_megatron_plugin.py" \
  "$t/test_megatron_example.py::test_example_localizes_an_injected_sdc" \
  "$t/test_megatron_example.py::test_example_localizes_a_hang" \
  --deselect "$t/test_megatron_bridge.py::test_real_callback_manager_drives_a_tp2_training_loop" \
  -m "not gpu" "$@" # the example's hang run is marked slow in the main suite
