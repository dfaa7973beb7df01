"""TorchTitan's llama3 debug model on CPU, watched by SCOUT; prints the verdicts.

Launch (CPU, Gloo, 6 local ranks = dp_replicate 3 x TP 2, two to three minutes on
two cores)::

    torchrun --standalone --nproc_per_node 6 examples/torchtitan/train.py --inject sdc:rank=2,step=3

or, with torchrun's module form and a slow rank::

    python -m torch.distributed.run --standalone --nproc_per_node 6 \\
        examples/torchtitan/train.py --inject straggler:rank=3,step=2

This is a small wrapper around TorchTitan's entry point (``torchtitan.train.main``):
it builds TorchTitan's real ``Trainer`` from TorchTitan flags and trains it. The only
SCOUT-specific part is the one override a user adds to any TorchTitan command::

    --override.imports 'scout_torchtitan.overrides.scout={"report_dir": "...", ...}'

The rest is what a CPU-only machine needs (``scout_torchtitan.testing``: CPU shims,
a generated tokenizer and dataset, TorchTitan's llama3 debug model shrunk and with a
math attention) and the fault injection. Flags of its own: ``--steps``,
``--report-dir`` and ``--inject kind:rank=R,step=S`` (0-based steps), which simulates
one faulty rank with SCOUT's test injectors:

* ``sdc``: every transformer block on rank R flips the lowest mantissa bit of its
  output from step S on (a silent, persistent compute fault);
* ``straggler``: everything SCOUT replays on rank R (blocks, embedding, LM head)
  sleeps 200 ms per call for four steps from step S (a slow rank);
* ``hang``: rank R freezes itself with SIGSTOP before the forward of step S and is
  woken after ``hang_timeout_s`` + 10 s, so the job can finish and report.

Every other flag goes to TorchTitan unchanged (``--training.local_batch_size 4``...).
At the end rank 0 prints every verdict of every replica group, read from the report
directory (``scout report <dir>`` renders it; a run first removes the previous run's
``rank-*.jsonl`` there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

HANG_TIMEOUT_S = 20.0
SCOUT: dict[str, Any] = {
    # a tiny model: replay every recipe at every step (production: every 20 steps)
    "replay_interval": 1,
    "embedding_interval": 1,
    "lm_head_interval": 1,
    "optimizer_interval": 1,
    "hang_timeout_s": HANG_TIMEOUT_S,
}


def _arguments() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps")
    parser.add_argument("--report-dir", default="runs/scout-torchtitan", help="SCOUT evidence")
    parser.add_argument("--inject", default=None, help="sdc|straggler|hang:rank=R,step=S")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree")
    return parser.parse_known_args()


def _verdicts(report: Path, run_id: str) -> list[dict[str, Any]]:
    """Every verdict of this run that any rank wrote, once each, in step order.

    Each replica group's verdicts are written by its own ranks (a straggler in group
    [1, 3, 5] is not in rank 0's session), so rank 0 reads the evidence of all ranks
    (one machine: one directory, ``<report_dir>/<run id>/``) instead of its own session.
    """
    from scout_core import load_report

    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for record in load_report(report).verdicts():
        if record.run_id != run_id:
            continue
        v = record.to_dict()
        key = (v["step"], v["surface"], v["failure"], tuple(v["outliers"]), tuple(v["group"]))
        seen.setdefault(key, v)
    return sorted(seen.values(), key=lambda v: (v["step"], v.get("time") or 0.0))


def _print_verdicts(
    verdicts: list[dict[str, Any]], spec: Any, freeze_file: Path, replicas: int
) -> None:
    if spec is not None:
        print(f"injected: {spec.kind} on rank {spec.rank} from step {spec.step}", flush=True)
    if not verdicts:
        print("SCOUT: no verdicts", flush=True)
    if replicas < 3:
        # Two peers have no majority: SCOUT names no rank, and a slow one is not flagged.
        print(
            f"note: {replicas} replica(s) per peer group (world size / --tp): SCOUT needs 3 "
            "or more to name a rank, so a fault here may go unnamed",
            flush=True,
        )
    for v in verdicts:
        who = ", ".join(f"rank {r}" for r in v["outliers"]) or "no single rank"
        print(
            f"SCOUT verdict: step {v['step']} {v['failure'] or v['status']} on {who} "
            f"({v['scope']}, surface {v['surface']}, peers {v['group']})",
            flush=True,
        )
        if v["failure"] == "hang" and freeze_file.is_file():
            frozen = float(freeze_file.read_text())
            print(f"SCOUT: hang verdict {v['time'] - frozen:.1f} s after the freeze", flush=True)


def main() -> None:
    args, titan_flags = _arguments()
    from scout_torchtitan.testing.faults import parse_inject

    try:
        spec = parse_inject(args.inject)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    scratch = Path(tempfile.mkdtemp(prefix=f"scout-titan-{rank}-"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(scratch / "hf"))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report = Path(args.report_dir).resolve()
    freeze_file = report / "freeze-time"

    # CPU shims before TorchTitan's trainer modules are imported (tests and CPU only).
    import scout_torchtitan
    from scout_torchtitan.testing import install_cpu_shims, titan_argv, write_assets

    install_cpu_shims()
    import torch.distributed as dist
    from scout_torchtitan.testing.faults import attach_fault
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger

    settings = {**SCOUT, "report_dir": str(report)}
    argv = titan_argv(
        write_assets(scratch / "assets"),  # the wheel ships no tokenizer or data
        steps=args.steps,
        dp_replicate=max(1, world // args.tp),
        tp=args.tp,
        dump_folder=str(scratch / "dump"),
        extra=[
            "--override.imports",
            f"scout_torchtitan.overrides.scout={json.dumps(settings)}",
            *titan_flags,
        ],
    )
    init_logger()
    trainer = ConfigManager().parse_args(argv).build()  # SCOUT attaches in here
    armed = attach_fault(
        spec,
        trainer,
        rank=rank,
        steps=args.steps,
        resume_after_s=HANG_TIMEOUT_S + 10.0,
        freeze_file=str(freeze_file),
    )
    session = scout_torchtitan.session_of(trainer)
    run_id = session.config.resolved_run_id() if session is not None else ""
    try:
        trainer.train()
        time.sleep(0.5)  # an observer verdict may still be on its way
    finally:
        if armed is not None:
            armed.detach()
        trainer.close()  # closes SCOUT's session: every rank's evidence is on disk
        if dist.is_initialized():
            # TorchTitan's rendezvous store lives in rank 0: nobody leaves before all are done
            dist.barrier()
            dist.destroy_process_group()
        shutil.rmtree(scratch, ignore_errors=True)
    if rank == 0:
        replicas = max(1, world // args.tp)
        _print_verdicts(_verdicts(report, run_id), spec, freeze_file, replicas)
        print("done", flush=True)


if __name__ == "__main__":
    main()
