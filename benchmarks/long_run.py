"""A long run with replay at every step: trainer memory, history sizes, evidence bytes.

    python benchmarks/long_run.py [--ranks 3] [--steps 5000] [--every 250] [--warmup 1000]

A DDP TinyLM (4 blocks) trains on ``--ranks`` CPU ranks (Gloo) with every replay recipe
due at every step (``replay_interval = embedding_interval = lm_head_interval =
optimizer_interval = 1``), the in-memory checkpoint gate and the incident merger on. Every
``--every`` steps each rank samples its resident set size (``VmRSS``), the size of
every history SCOUT keeps (session verdicts and incidents, the replay driver's round
history, the verdict maker's confirmation state, the gate's boundary results, the
incident book) and the bytes of evidence written so far. The JSON printed at the end
has those series per rank and a summary: RSS growth after ``--warmup`` steps (total and
per step), the largest size each history reached, and evidence bytes per step. A long
run must be flat: after warm-up, RSS grows by no more than allocator noise and every
history stays under its bound.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent


def _rss_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*.jsonl")) if directory.is_dir() else 0


def _sizes(session: Any) -> dict[str, int]:
    replay = session.replay
    judge = replay.verdicts
    gate = session.checkpoints
    return {
        "session.verdicts": len(session.verdicts),
        "session.incidents": len(session.incidents),
        "replay.history": len(replay.history),
        "verdict_maker.streaks": len(judge._streak) + len(judge._bcast_streak),
        "verdict_maker.baselines": sum(len(v) for v in judge._bcast_base.values()),
        "gate.history": len(gate.history) if gate is not None else 0,
        "gc.objects": len(gc.get_objects()),
    }


def rank_body(steps: int, every: int, report_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout
    from scout_core.testing import TinyLM, train_step

    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    cfg = scout.Config(
        report_dir=report_dir,
        run_id="long-run",
        replay_interval=1,
        embedding_interval=1,
        lm_head_interval=1,
        optimizer_interval=1,
        observer=False,
    )
    session = scout.enable(ddp, opt, config=cfg)
    run_dir = Path(report_dir) / "long-run"
    samples = []
    start = time.monotonic()
    for step in range(steps):
        train_step(ddp, opt, step, rank)
        if (step + 1) % every == 0:
            gc.collect()
            samples.append(
                {"step": step + 1, "rss_kb": _rss_kb(), "evidence_bytes": _bytes(run_dir)}
                | _sizes(session)
            )
    elapsed = time.monotonic() - start
    session.close()
    return {"rank": rank, "samples": samples, "seconds": elapsed}


def summarize(per_rank: list[dict[str, Any]], steps: int, warmup: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": {}}
    growth = []
    for r in per_rank:
        after = [s for s in r["samples"] if s["step"] >= warmup]
        first, last = after[0], after[-1]
        span = max(last["step"] - first["step"], 1)
        kb = last["rss_kb"] - first["rss_kb"]
        growth.append(kb)
        keys = [k for k in first if k not in {"step", "rss_kb", "evidence_bytes"}]
        out["ranks"][r["rank"]] = {
            "rss_kb_after_warmup": [first["rss_kb"], last["rss_kb"]],
            "rss_growth_kb": kb,
            "rss_growth_bytes_per_step": round(1024 * kb / span, 1),
            "history_max": {k: max(s[k] for s in r["samples"]) for k in keys},
            "history_last": {k: last[k] for k in keys},
            "gc_objects_growth_after_warmup": last["gc.objects"] - first["gc.objects"],
            "steps_per_second": round(steps / r["seconds"], 1),
        }
    evidence = max(s["evidence_bytes"] for r in per_rank for s in r["samples"])
    out["evidence_bytes"] = evidence
    out["evidence_bytes_per_step"] = round(evidence / steps, 2)
    out["max_rss_growth_kb_after_warmup"] = max(growth)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--report-dir", default=None, help="default: a fresh temp directory")
    args = parser.parse_args(argv)
    if str(_HERE) not in sys.path:  # ranks import the body by module name
        sys.path.insert(0, str(_HERE))
    import tempfile

    from scout_core.testing.harness import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        report = args.report_dir or os.path.join(tmp, "report")
        per_rank = run_ranks(
            "long_run:rank_body",
            args.ranks,
            args=(args.steps, args.every, report),
            timeout_s=max(600, args.steps),
            env={"OMP_NUM_THREADS": "1"},
        )
    result = {
        "benchmark": "long_run",
        "ranks": args.ranks,
        "steps": args.steps,
        "replay_interval": 1,
        "warmup": args.warmup,
        "summary": summarize(per_rank, args.steps, args.warmup),
        "samples": {r["rank"]: r["samples"] for r in per_rank},
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
