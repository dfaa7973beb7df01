#!/usr/bin/env bash
# The GPU checks: every test marked `gpu`, run from the source tree with the machine's
# own CUDA torch (no .venv, no install: a lent GPU machine may have no network and no
# DeepSpeed). Extra arguments go to pytest (e.g. `bash scripts/gpu_check.sh -k moe`).
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
  exit 1
fi
exit "$code"
