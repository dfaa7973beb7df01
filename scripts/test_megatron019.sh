#!/usr/bin/env bash
# The megatron-core 0.19 set: megatron-core 0.17 and later and Megatron-Bridge 0.5 and
# later install only on Python 3.12. Builds .venv-mcore019 (once: Python 3.12 found as
# `python3.12` or in pyenv's versions, torch 2.13.0 from the index (its CUDA build runs on
# CPU), megatron-core 0.19.2, Megatron-Bridge 0.6.2 without dependencies, the core and
# scout-megatron; installed with uv when it can be had, else pip) and runs the version and
# probe tests, Bridge 0.6.2's contract and checkpoint seam, DP3 x TP2 training, MoE and
# the example's SDC run there. Extra arguments go to pytest. Called by .ci/run after the
# main tests; prints one line and exits 0 where no Python 3.12 exists.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "scout megatron 0.19: $*" >&2; }
runs() { "$1" -c '' >/dev/null 2>&1; } # a pyenv shim without that version refuses here

find_python312() {
  local candidate
  if command -v python3.12 >/dev/null && runs python3.12; then
    command -v python3.12
    return
  fi
  if command -v pyenv >/dev/null; then
    for candidate in "$(pyenv root)"/versions/3.12*/bin/python3.12; do
      if [ -x "$candidate" ] && runs "$candidate"; then
        echo "$candidate"
        return
      fi
    done
  fi
  return 1
}

if ! PY=$(find_python312); then
  say "no Python 3.12 here: the megatron-core 0.19 set is not run"
  exit 0
fi
env_dir=.venv-mcore019
stamp=$env_dir/.scout-bootstrap
want="$(cat pyproject.toml plugins/megatron/pyproject.toml scripts/test_megatron019.sh scripts/constraints-dev.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  rm -rf "$env_dir"
  say "creating $env_dir with $("$PY" --version 2>&1) ($PY)"
  "$PY" -m venv "$env_dir"
  uv_home=${XDG_CACHE_HOME:-$HOME/.cache}/scout-bootstrap-uv
  if [ ! -x "$uv_home/bin/uv" ]; then
    { "$PY" -m venv "$uv_home" && "$uv_home/bin/pip" install -q uv; } >/dev/null 2>&1 || true
  fi
  if [ -x "$uv_home/bin/uv" ]; then
    install=("$uv_home/bin/uv" pip install -q --python "$env_dir/bin/python")
  else
    install=("$env_dir/bin/pip" install -q --disable-pip-version-check)
  fi
  say "installing torch==2.13.0 (about 530 MB plus its CUDA libraries), megatron-core 0.19.2, Megatron-Bridge 0.6.2 with ${install[0]}"
  "${install[@]}" "torch==2.13.0" psutil -c scripts/constraints-dev.txt \
    -e ".[dev]" -e plugins/megatron "megatron-core==0.19.2"
  "${install[@]}" --no-deps "megatron-bridge==0.6.2"
  echo "$want" >"$stamp"
fi
t=plugins/megatron/tests
"$env_dir/bin/python" -m pytest -q -p no:cacheprovider --durations=10 \
  "$t/test_megatron_versions.py" "$t/test_megatron_bridge.py" "$t/test_megatron_plugin.py" \
  "$t/test_megatron_gate.py::test_bridge_manager_seam_refuses_a_save_after_sdc_and_loads_the_newest_verified" \
  "$t/test_megatron_training.py" "$t/test_megatron_moe.py" \
  "$t/test_megatron_example.py::test_example_localizes_an_injected_sdc" \
  --deselect "$t/test_megatron_bridge.py::test_real_callback_manager_drives_a_tp2_training_loop" \
  -m "not gpu" "$@" # the gate and training modules are marked slow in the main suite
