#!/usr/bin/env bash
# Issue 15's acceptance figures on a quiet machine, inside a fixed time budget:
# benchmarks/healthy_path.py --layers 12, 32 and 64, median of 3 runs each, for this
# checkout ("after") and an earlier one ("before"), plus one CUDA run when a GPU is present.
#
#   mkdir -p .before && git archive 475fef4 | tar -x -C .before && echo 475fef4 > .before/.commit
#   timeout 420 env BUDGET_S=400 bash scripts/quiet_bench.sh
#
# 475fef4 is main just before issue 15's work was merged (de52108^1, the replay branch).
#
# Knobs (environment): BEFORE (default .before; skipped when absent), BUDGET_S (default
# 400: every stage gets what is left, minus a reserve for the summary), PYTHON (default
# python3), LAYERS (default "12 32 64"), STEPS_<layers> (default 170 / 110 / 70 for 12 /
# 32 / 64: 10 warm-up steps then 8 / 5 / 3 whole 20-step periods, so every recipe phase
# is measured equally often; about 50 / 80 / 105 s per stage at 0.14 / 0.37 / 0.76 CPU-s
# per model step, measured on a Xeon core; 110 for other sizes), CUDA_STEPS (default
# 110; the CUDA run uses the first size), LEAN (default 1: one more run per other size
# with --gate-memory lean), BENCH_OUT (default $OUT if set, else ./quiet-bench-out).
#
# Each run is one process pair (2 ranks, DDP over Gloo, one thread per rank) that trains
# the model with and without SCOUT, interleaved step by step, so both see the same load.
# For one model size the 3 "after" and 3 "before" runs run at the same time (12 rank
# processes; on 16 cores nothing waits for a core); the CUDA run shares the first stage,
# a "lean" run (this checkout, gate_memory = lean) each other one. With fewer than 16
# cores (or SEQUENTIAL=1) the runs go one after another instead, so each pair has the
# machine to itself, "after" and "before" alternating (give BUDGET_S about 1800 for the
# three sizes on 2 cores). Every run writes its own JSON; whatever finished before the budget ran out is summarised at the end
# (benchmarks/healthy_compare.py: medians as JSON, then the markdown table for
# docs/replay.md), so a run stopped by `timeout` still prints.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BEFORE=${BEFORE:-.before}
BUDGET_S=${BUDGET_S:-400}
RESERVE_S=15
OUTDIR=${BENCH_OUT:-${OUT:-$ROOT/quiet-bench-out}}
mkdir -p "$OUTDIR"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))

left() { echo $((DEADLINE - $(date +%s) - RESERVE_S)); }

echo "quiet_bench: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), budget ${BUDGET_S}s, out $OUTDIR"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
echo "after: $(git rev-parse --short HEAD 2>/dev/null || echo 'this tree')"
TREES=(after)
if [ -d "$BEFORE/scout_core" ]; then
  TREES+=(before)
  echo "before: $BEFORE ($(cat "$BEFORE/.commit" 2>/dev/null || echo 'git archive'))"
else
  echo "before: $BEFORE not found, only this checkout is measured" >&2
fi
SEQUENTIAL=${SEQUENTIAL:-$([ "$(nproc)" -lt 16 ] && echo 1 || echo 0)}
echo "quiet_bench: runs $([ "$SEQUENTIAL" = 1 ] && echo 'one after another' || echo 'of one size at once')"
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

path_of() {  # the PYTHONPATH of a tree label
  case "$1" in
    before) echo "$(cd "$BEFORE" && pwd)" ;;
    *) echo "$ROOT" ;;
  esac
}

PIDS=()
NAMES=()
run_one() {  # tree layers n steps device [extra args...]: one run, in the background
  local tree=$1 layers=$2 n=$3 steps=$4 device=$5
  shift 5
  local name="$OUTDIR/$tree-$layers-$n"
  if [ "$(left)" -lt 5 ]; then
    echo "quiet_bench: no budget left for $tree-$layers-$n, skipped" >&2
    return
  fi
  PYTHONPATH="$(path_of "$tree")" timeout -k 5 "$(left)" "$PY" benchmarks/healthy_path.py \
    --layers "$layers" --steps "$steps" --repeats 1 --warm 10 --device "$device" "$@" \
    >"$name.part" 2>"$name.log" &
  PIDS+=($!)
  NAMES+=("$name")
  if [ "$SEQUENTIAL" = 1 ]; then
    collect  # one pair at a time: the next run starts when this one ended
  fi
}

collect() {  # wait for this stage's runs; a run that finished keeps its JSON
  local i
  for i in "${!PIDS[@]}"; do
    if wait "${PIDS[$i]}"; then
      mv "${NAMES[$i]}.part" "${NAMES[$i]}.json"
    fi
  done
  PIDS=()
  NAMES=()
}

stage() {  # layers steps: 3 runs per tree at once, waited for
  local layers=$1 steps=$2
  if [ "$(left)" -lt 20 ]; then
    echo "quiet_bench: no budget left for $layers layers, skipped" >&2
    return
  fi
  local t0
  t0=$(date +%s)
  for n in 1 2 3; do
    for tree in "${TREES[@]}"; do
      run_one "$tree" "$layers" "$n" "$steps" cpu
    done
  done
  if [ "$layers" = "$FIRST" ] && [ "$CUDA" = 1 ]; then
    run_one cuda "$layers" 1 "${CUDA_STEPS:-110}" cuda
  elif [ "${LEAN:-1}" = 1 ]; then  # one run with the lean gate (memory at most 2x)
    run_one lean "$layers" 1 "$steps" cpu --gate-memory lean
  fi
  collect
  echo "quiet_bench: $layers layers done in $(($(date +%s) - t0))s ($(ls "$OUTDIR"/*-"$layers"-*.json 2>/dev/null | wc -l) runs finished)"
}

summary() {
  echo "quiet_bench: total $(($(date +%s) - START))s"
  for log in "$OUTDIR"/*.log; do  # a failed run says why (its last lines)
    if [ -s "$log" ] && ! [ -f "${log%.log}.json" ]; then
      echo "--- $(basename "$log") (no result):"
      tail -n 5 "$log"
    fi
  done
  "$PY" benchmarks/healthy_compare.py "$OUTDIR"
}

stopped() {  # an outer `timeout` or ^C: stop this script's runs, print what finished
  trap - TERM INT
  echo "quiet_bench: stopped, summarising what finished" >&2
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  summary
  exit 124
}
trap stopped TERM INT

steps_for() {  # STEPS_<layers> if set, else the default of that size
  local var="STEPS_$1" default=110
  case "$1" in 12) default=170 ;; 32) default=110 ;; 64) default=70 ;; esac
  echo "${!var:-$default}"
}

FIRST=""
for layers in ${LAYERS:-12 32 64}; do
  FIRST=${FIRST:-$layers}
  stage "$layers" "$(steps_for "$layers")"
done

summary
