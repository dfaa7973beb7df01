#!/usr/bin/env bash
# The GPU checks: every test marked `gpu`, run from the source tree with the machine's
# own CUDA torch (no .venv, no install: a lent GPU machine may have no network and no
# DeepSpeed). Extra arguments go to pytest (e.g. `bash scripts/gpu_check.sh -k moe`).
# With a GPU present it then runs the healthy-path benchmark on CUDA (see below).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD:$PWD/plugins/deepspeed:$PWD/plugins/megatron:$PWD/plugins/torchtitan${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYEOF'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"device 0: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} device(s)")
    print(f"NCCL: {torch.cuda.nccl.version() if hasattr(torch.cuda, 'nccl') else 'n/a'}")
PYEOF
"$PY" -m pytest -m gpu -p no:cacheprovider -o addopts="-ra" "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "gpu_check: no test marked gpu was collected" >&2
  code=1
fi
# The healthy-path benchmark on CUDA (issue 15): 2 ranks share the GPU over Gloo with
# CUDA tensors; it prints the same JSON as on CPU. SCOUT_GPU_BENCH=0 skips it;
# SCOUT_GPU_BENCH_ARGS replaces its arguments (default: 12 layers, 110 steps, one run).
if [ "${SCOUT_GPU_BENCH:-1}" != 0 ] && "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check: benchmarks/healthy_path.py --device cuda"
  # shellcheck disable=SC2086  # the arguments are meant to split
  timeout -k 5 "${SCOUT_GPU_BENCH_TIMEOUT:-300}" "$PY" benchmarks/healthy_path.py --device cuda \
    ${SCOUT_GPU_BENCH_ARGS:---layers 12 --steps 110 --repeats 1}
  bench=$?
  if [ "$bench" -ne 0 ]; then
    echo "gpu_check: the CUDA healthy-path benchmark failed (exit $bench)" >&2
    [ "$code" -eq 0 ] && code=$bench
  fi
fi
exit "$code"
