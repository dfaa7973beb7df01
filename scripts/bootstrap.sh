#!/usr/bin/env bash
# Create .venv (once) with the pinned CPU torch, the core, the plugins and the test
# tools. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.scout-bootstrap
want="$(cat pyproject.toml plugins/*/pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch is pinned to the CPU wheel: an unpinned torch pulls several GB of CUDA.
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0" \
    -e ".[dev]" -e plugins/deepspeed -e plugins/megatron -e plugins/torchtitan
  # Megatron-Bridge's callback API is tested from its installed callbacks.py, which
  # needs nothing else; Bridge's own dependencies (Transformer Engine ...) need CUDA.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "megatron-bridge==0.3.1"
  echo "$want" > "$stamp"
fi
