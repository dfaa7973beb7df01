"""``scout demo``: a small multi-rank CPU training job with injected faults, and its verdicts.

Four local Gloo ranks train a tiny model (:mod:`scout_core.testing.models`) under DDP with
SCOUT on. One rank's sampled layer flips a low-mantissa bit of its output (an SDC no
tolerance check would see); later another rank's turns 200 ms slow. The demo prints each
verdict; it exits 0 only if both faults land on the right ranks and nothing else is flagged.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from scout_core.testing.models import TinyLM, train_step

__all__ = ["main", "run_demo_rank"]


def run_demo_rank(
    report_dir: str,
    sdc_rank: int,
    slow_rank: int,
    *,
    steps: int = 10,
    sdc_step: int = 3,
    slow_step: int = 6,
) -> dict[str, Any]:
    """Rank body of the demo (module level so spawned ranks can import it)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.replay.boundary import Boundary
    from scout_core.testing.injectors import BitFlip, Faults

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = TinyLM()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    layers = len(model.layers)
    slow_steps = range(slow_step, slow_step + 3)
    faults = (
        Faults()
        .at(rank=sdc_rank, step=sdc_step)
        .corrupt_output(f"layers.{sdc_step % layers}", BitFlip(bit=0))
    )
    for s in slow_steps:
        faults.at(rank=slow_rank, step=s).delay_compute(f"layers.{s % layers}", 0.2)
    faults.attach(ddp, opt)
    cfg = Config(
        report_dir=report_dir,
        run_id="scout-demo",
        replay_interval=1,
        embedding_interval=4,
        lm_head_interval=4,
        optimizer_interval=2,
        observer=False,
    )
    with enable_torch(ddp, opt, cfg) as session:
        rounds = 0

        def count(boundary: Boundary) -> None:
            nonlocal rounds
            rounds += len(boundary.rounds)

        session.on_boundary(count)
        for step in range(steps):
            train_step(ddp, opt, step, rank)
        verdicts = [r.to_dict() for r in session.verdicts]
    return {"verdicts": verdicts, "rounds": rounds}


def _describe(v: dict[str, Any]) -> str:
    who = ", ".join(f"rank {r}" for r in v["outliers"]) or f"group {v['group']} (no single rank)"
    failure = v["failure"] or v["status"]
    return (
        f"step {v['step']:>2}  {failure:<13} culprit: {who:<10} surface: {v['surface']:<28} "
        f"peers: {v['group']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; exit 0 only when both faults were localized and nothing else flagged."""
    from scout_core.testing.harness import run_ranks

    parser = argparse.ArgumentParser(
        prog="scout demo",
        description="A small multi-rank CPU training job with injected faults, and its verdicts.",
    )
    parser.add_argument("--ranks", type=int, default=4, help="local ranks to spawn (>= 4)")
    parser.add_argument("--report-dir", default=None, help="where evidence records go")
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--sdc-step", type=int, default=3, help="step of the bit flip")
    parser.add_argument(
        "--slow-step", type=int, default=6, help="first of the three straggler steps"
    )
    args = parser.parse_args(list(argv or []))
    if args.ranks < 4:
        parser.error("the demo needs at least 4 ranks")
    last_fault = max(args.sdc_step, args.slow_step + 2)
    if min(args.sdc_step, args.slow_step) < 1 or args.steps <= last_fault:
        parser.error(f"the faults must fall inside the run: --steps must exceed {last_fault}")
    report = args.report_dir or os.path.join(os.getcwd(), "scout-demo-report")
    sdc_rank, slow_rank = 1, 2
    print(f"scout demo: {args.ranks} ranks, DDP on CPU (Gloo), tiny model, replay every step")
    print(
        f"  injecting: 1-bit SDC in rank {sdc_rank}'s sampled layer output at step {args.sdc_step},"
    )
    print(
        f"             200 ms compute straggler on rank {slow_rank} at steps "
        f"{args.slow_step}-{args.slow_step + 2}"
    )
    start = time.monotonic()
    results = run_ranks(
        run_demo_rank,
        args.ranks,
        args=(report, sdc_rank, slow_rank),
        kwargs={"steps": args.steps, "sdc_step": args.sdc_step, "slow_step": args.slow_step},
        timeout_s=300,
        env={"OMP_NUM_THREADS": "1"},
    )
    seen: dict[str, dict[str, Any]] = {}
    for res in results:
        for v in res["verdicts"]:
            seen[f"{v['step']}|{v['surface']}|{v['failure']}|{v['outliers']}"] = v
    verdicts = sorted(seen.values(), key=lambda v: (v["step"], v["surface"]))
    print(f"\nverdicts ({len(verdicts)}), after {time.monotonic() - start:.1f}s:")
    for v in verdicts:
        print("  " + _describe(v))
    sdc = [v for v in verdicts if v["failure"] == "sdc" and v["outliers"] == [sdc_rank]]
    slow = [v for v in verdicts if v["failure"] == "straggler" and v["outliers"] == [slow_rank]]
    other = [v for v in verdicts if v not in sdc and v not in slow]
    # A straggler needs straggler_rounds (2) consecutive slow hidden rounds, one per step:
    # slow at s, s+1, s+2 is reported at s+1 and s+2, whatever other recipes ran between.
    expected = [args.slow_step + 1, args.slow_step + 2]
    on_time = sorted(v["step"] for v in slow) == expected
    ok = bool(sdc) and on_time and not other
    print(
        f"\nSDC localized to rank {sdc_rank}: {'yes' if sdc else 'NO'}; "
        f"straggler localized to rank {slow_rank} at steps {expected}: "
        f"{'yes' if on_time else 'NO'}; other flags: {len(other)}"
    )
    shown = os.path.relpath(report) if _inside_cwd(report) else report
    print(f"evidence records: {shown}   (render with: scout report {shown})")
    return 0 if ok else 1


def _inside_cwd(path: str) -> bool:
    """Whether ``path`` lies under the working directory (shown relative to it, then)."""
    here = os.path.realpath(os.getcwd())
    return os.path.commonpath([here, os.path.realpath(path)]) == here
