#!/usr/bin/env bash
# Create .venv (once) with the pinned CPU torch, the core, the plugins and the test
# tools. Safe to run again: it only installs what is missing. Progress goes to stderr,
# so a first run (a few minutes) never looks stuck.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "scout bootstrap: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
if [ -n "${SCOUT_BOOTSTRAP_NO_INSTALL:-}" ] && [ -x .venv/bin/python ]; then
  # Set by the docs test, which runs documented commands inside the environment it
  # is testing with: it must never reinstall that environment.
  exit 0
fi
stamp=.venv/.scout-bootstrap
want="$(cat pyproject.toml plugins/*/pyproject.toml scripts/bootstrap.sh scripts/constraints-dev.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  pip=(.venv/bin/pip install -q --disable-pip-version-check)
  # The core was distributed as "scout" before it became "scout-core"; the two would
  # share the scout_core package and the scout script.
  .venv/bin/pip uninstall -q -y scout >/dev/null 2>&1 || true
  # torch is pinned to the CPU wheel: an unpinned torch pulls several GB of CUDA.
  say "installing torch==2.13.0 (CPU build; about a minute the first time)"
  "${pip[@]}" "torch==2.13.0"
  say "installing scout-core, its three plugins, DeepSpeed, Megatron-Core, TorchTitan and the test tools"
  "${pip[@]}" "torch==2.13.0" \
    -c scripts/constraints-dev.txt -e ".[dev]" -e plugins/deepspeed -e plugins/megatron -e plugins/torchtitan
  # Megatron-Bridge's callback API is tested from its installed callbacks.py, which
  # needs nothing else; Bridge's own dependencies (Transformer Engine ...) need CUDA.
  say "installing megatron-bridge==0.3.1 (callbacks only, no dependencies)"
  "${pip[@]}" --no-deps "megatron-bridge==0.3.1"
  echo "$want" > "$stamp"
  say "ready"
fi
