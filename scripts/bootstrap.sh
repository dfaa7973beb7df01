#!/usr/bin/env bash
# Create .venv (once) with torch 2.13.0, the core, the plugins, DeepSpeed, megatron-core,
# TorchTitan and the test tools. Safe to run again: it only installs what is missing.
# Progress goes to stderr, so a first run (a few minutes) never looks stuck.
#
# Python: $PYTHON if set, else python3.12 (on PATH or in pyenv's versions), the Python of
# NVIDIA's containers and of current megatron-core (0.17 and later install only on 3.12):
# megatron-core 0.19.2 and Megatron-Bridge 0.6.2. Without a Python 3.12 it falls back to
# python3 with megatron-core 0.16.1 and Bridge 0.3.1, and says so. On 3.12, torch 2.13.0
# is the index's default build (about 530 MB plus its CUDA libraries; it runs on CPU),
# installed with uv where uv can be had; on 3.11 pip takes the CPU wheel on this disk.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pyenv_lib.sh
. scripts/pyenv_lib.sh
say() { echo "scout bootstrap: $*" >&2; }

if [ -n "${SCOUT_BOOTSTRAP_NO_INSTALL:-}" ] && [ -x .venv/bin/python ]; then
  # Set by the docs test, which runs documented commands inside the environment it
  # is testing with: it must never reinstall that environment.
  exit 0
fi
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
  why="PYTHON=$PYTHON"
elif PY=$(find_python 3.12); then
  why="Python 3.12 found: megatron-core 0.19.2 and Megatron-Bridge 0.6.2"
else
  PY=python3
  why="no Python 3.12 here, so python3 with megatron-core 0.16.1 and Megatron-Bridge 0.3.1 (0.17 and later need 3.12)"
fi
version=$(pyver "$PY")
if [ "$version" = 3.12 ] || [ "$version" \> 3.12 ]; then
  megatron=megatron-core==0.19.2 bridge=megatron-bridge==0.6.2 mode=uv
else
  # pip takes the CPU wheel of torch on this disk; uv would not
  megatron=megatron-core==0.16.1 bridge=megatron-bridge==0.3.1 mode=pip
fi
if [ -x .venv/bin/python ]; then
  have=$(pyver .venv/bin/python 2>/dev/null || echo none)
  if [ "$have" != "$version" ]; then
    say ".venv has Python $have, this run uses $version: recreating it"
    rm -rf .venv
  fi
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1) ($why)"
  "$PY" -m venv .venv
fi
stamp=.venv/.scout-bootstrap
want="$version $(cat pyproject.toml plugins/*/pyproject.toml scripts/bootstrap.sh scripts/pyenv_lib.sh scripts/constraints-dev.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  installer .venv "$mode"
  # The core was distributed as "scout" before it became "scout-core"; the two would
  # share the scout_core package and the scout script.
  .venv/bin/python -m pip uninstall -q -y scout >/dev/null 2>&1 || true
  say "installing torch==2.13.0, scout-core, its three plugins, DeepSpeed, $megatron, TorchTitan and the test tools with ${install[0]##*/} ($why; the first time takes minutes)"
  "${install[@]}" "torch==2.13.0" psutil -c scripts/constraints-dev.txt "$megatron" \
    -e ".[dev]" -e plugins/deepspeed -e plugins/megatron -e plugins/torchtitan
  # Megatron-Bridge's callback API is tested from its installed package; Bridge's own
  # dependencies (Transformer Engine ...) need CUDA, so it comes without them.
  say "installing $bridge (without its dependencies)"
  "${install[@]}" --no-deps "$bridge"
  # DeepSpeed compiles its CPU communication op on first use, in whichever rank gets there
  # first while the others wait on a lock file: build it once here instead.
  say "building DeepSpeed's CPU communication op (once per Python and torch)"
  .venv/bin/python -c 'from deepspeed.ops.op_builder import ShareMemCommBuilder; ShareMemCommBuilder().load(verbose=False)' \
    >/dev/null 2>&1 || say "could not prebuild it; DeepSpeed builds it on first use"
  # uv installs no bytecode, and where PYTHONDONTWRITEBYTECODE is set nothing writes it
  # later: every process (each rank, observer and launched example) would compile torch
  # from source, 3.3 s an import of torch here instead of 1.7 s.
  say "compiling bytecode"
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv/bin/python -m compileall -q -j 0 "$site" scout_core plugins >/dev/null 2>&1 || true
  echo "$want" >"$stamp"
  say "ready: $(.venv/bin/python --version), $(du -sh .venv | cut -f1) in .venv"
fi
