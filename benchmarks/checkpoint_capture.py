"""Checkpoint-gate cost: blocking time per in-memory capture, before and after buffer reuse.

    python benchmarks/checkpoint_capture.py [--layers 8] [--width 512] [--boundaries 16]
        [--interval 5] [--gap 1] [--catalog 4] [--warmup 5] [--checkpoint-dir DIR]

One process (a one-rank Gloo job, so the gate's job-wide combine really runs)
trains a stack of ``--layers`` linear blocks of ``--width`` with AdamW. Four phases
alternate in blocks of ``--gap`` training steps (so none always runs on a warmer
machine), each gated block ending in a gate boundary, ``--boundaries`` per phase
(every boundary clean, a catalog of ``--catalog`` recipes, so cycles close and
generations rotate):

* ``plain``: training only;
* ``copy``: the gate with a fresh host copy at every capture, all of it before the
  capture returns (``reuse`` and ``overlap`` off: the behaviour before issue 15's
  work, the *before* figure);
* ``reuse``: each capture copies into the buffers of the generation it replaces (no
  allocation, no first-touch page faults), still all before it returns;
* ``overlap``: the gate as it runs by default: reuse, and on CPU the parameters and
  optimizer state copied on a background thread during the next iteration (joined
  by the next optimizer step), so the capture blocks only for the rest;
* ``lean``: the default plus ``Config.gate_memory = "lean"`` (at most two
  generations; once a verified generation exists, routine boundaries copy nothing).

``--interval 5`` is the default cadence of gate boundaries (with the spread schedule
one of the four recipe tracks, each every 20 steps, is due every 5 steps); the
coordinator here copies at every boundary (``capture_interval`` 1: a session copies
once per ``Config.gate_capture_interval``, by default every 20 steps, so the predicted
overhead is an upper bound for it). The interval only enters the prediction, so the
run itself stays short (``--gap`` steps per boundary; it finishes in well under a
minute on an idle core).
It prints one JSON object: per gated phase, the capture's blocking time (median, p90
and max over the captures taken, and the median over all boundaries, where a skipped
capture counts 0; on CUDA the copy runs on a side stream into pinned buffers and the
blocking time is only the time to enqueue it; ``min`` is the uncontended cost on a
busy machine), the boundary's median time, the host
memory the gate held at most and at the end, as bytes and as a multiple of the model
+ optimizer state, and the predicted amortized overhead ``median boundary / (interval
* mean plain step)``; ``speedup_over_copy`` compares the old behaviour with each newer
one. Measured step means
are printed too; on a shared machine they are dominated by noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

PHASES = ("plain", "copy", "reuse", "overlap", "lean")


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any], str]:
    """Model, AdamW, a batch and one gate coordinator per gated phase (one-rank Gloo)."""
    import torch
    import torch.distributed as dist

    from scout_core.checkpoint import CheckpointCoordinator, default_rng_streams
    from scout_core.topology.groups import diagnostic_group

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    blocks = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = torch.nn.Sequential(*blocks).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(16, args.width, device=device)
    group = diagnostic_group([0])
    coords = {}
    for phase in PHASES[1:]:
        coords[phase] = CheckpointCoordinator(
            model,
            [opt],
            rng_streams=default_rng_streams(),
            catalog_size=args.catalog,
            group=group,
            ranks=[0],
            run_id="bench",
            checkpoint_dir=None
            if args.checkpoint_dir is None
            else f"{args.checkpoint_dir}/{phase}",
            memory="lean" if phase == "lean" else "full",
        )
    coords["copy"].memory.reuse = False
    for phase in ("copy", "reuse"):  # both copy everything before capture returns
        coords[phase].memory.overlap = False
    return model, opt, batch, coords, device


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from scout_core.decision.gate import Outcome

    model, opt, batch, coords, device = _setup(args)
    extra: dict[str, Any] = {"step": 0, "cursor": torch.zeros(4, dtype=torch.int64)}

    def step() -> None:
        loss = model(batch).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    steps: dict[str, list[float]] = {p: [] for p in PHASES}
    per: dict[str, dict[str, list[float]]] = {
        p: {"boundary": [], "blocking": [], "captured": [], "held": []} for p in PHASES[1:]
    }
    for block in range(len(PHASES) * args.boundaries):
        phase = PHASES[block % len(PHASES)]
        for i in range(args.gap):
            sync()
            t0 = time.monotonic()
            step()
            if phase != "plain" and i == args.gap - 1:
                coord, rec = coords[phase], per[phase]
                n = len(rec["boundary"])
                extra["step"] = n
                before = _latest(coord)
                b0 = time.monotonic()
                result = coord.on_boundary(n, Outcome.CLEAN, n % args.catalog, extra=extra)
                rec["boundary"].append(time.monotonic() - b0)
                rec["blocking"].append(result.capture_s)
                if _latest(coord) is not before:  # a copy was taken
                    rec["captured"].append(result.capture_s)
                rec["held"].append(float(coord.memory.held_bytes()))
            sync()
            steps[phase].append(time.monotonic() - t0)
    state = coords["reuse"].memory.state_bytes()
    out = {
        "device": device,
        "params": sum(p.numel() for p in model.parameters()),
        "state_bytes": state,
        "steps": steps,
        "per": per,
        "peak": {p: coords[p].memory.peak_bytes for p in PHASES[1:]},
    }
    for coord in coords.values():
        coord.close()
    return out


def _latest(coord: Any) -> Any:
    return coord.memory.latest


def _ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"min": 0.0, "median": 0.0, "p90": 0.0, "max": 0.0}
    p90 = (
        statistics.quantiles(values, n=10, method="inclusive")[-1]
        if len(values) >= 2
        else values[0]
    )
    return {
        "min": 1e3 * min(values),  # the uncontended cost on a busy machine
        "median": 1e3 * statistics.median(values),
        "p90": 1e3 * p90,
        "max": 1e3 * max(values),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every phase in one run and summarise them."""
    import torch.distributed as dist

    try:
        m = _measure(args)
    finally:
        dist.destroy_process_group()
    plain = statistics.fmean(m["steps"]["plain"])
    state = m["state_bytes"]
    phases: dict[str, Any] = {}
    for phase in PHASES[1:]:
        rec = m["per"][phase]
        boundary = statistics.median(rec["boundary"])
        phases[phase] = {
            "captures": len(rec["captured"]),
            "boundaries": len(rec["boundary"]),
            "capture_blocking_ms": _ms(rec["captured"]),
            "blocking_per_boundary_ms_median": 1e3 * statistics.median(rec["blocking"]),
            "boundary_ms_median": 1e3 * boundary,
            "held_bytes_peak": m["peak"][phase],
            "held_over_state_peak": m["peak"][phase] / max(1, state),
            "held_over_state_end": rec["held"][-1] / max(1, state),
            "step_ms_mean": 1e3 * statistics.fmean(m["steps"][phase]),
            "overhead_predicted": boundary / (args.interval * plain),
        }
    copy = phases["copy"]
    return {
        "device": m["device"],
        "params": m["params"],
        # Host memory the gate holds on this rank, and as a multiple of the live model +
        # optimizer state (one generation is ~1x; full holds up to ~3x, lean ~2x).
        "state_bytes": state,
        "interval": args.interval,
        "catalog_size": args.catalog,
        "step_ms_mean_plain": 1e3 * plain,
        "phases": phases,
        # Blocking time per capture of the old behaviour over each newer one.
        "speedup_over_copy": {
            phase: {
                stat: (
                    copy["capture_blocking_ms"][stat] / phases[phase]["capture_blocking_ms"][stat]
                    if phases[phase]["capture_blocking_ms"][stat]
                    else None
                )
                for stat in ("min", "median")
            }
            for phase in PHASES[2:]
        },
        "durable": args.checkpoint_dir is not None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--boundaries", type=int, default=16, help="gate boundaries per phase")
    p.add_argument(
        "--interval", type=int, default=5, help="steps between gate boundaries (prediction)"
    )
    p.add_argument("--gap", type=int, default=1, help="training steps run between boundaries")
    p.add_argument("--catalog", type=int, default=4, help="recipes in one gate cycle (K)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--checkpoint-dir", default=None, help="also persist candidates here")
    p.add_argument("--tmp-checkpoint-dir", action="store_true", help="persist to a temp dir")
    args = p.parse_args(argv)
    if args.tmp_checkpoint_dir and args.checkpoint_dir is None:
        with tempfile.TemporaryDirectory(prefix="scout-bench-") as tmp:
            args.checkpoint_dir = tmp
            print(json.dumps(run(args), indent=2))
        return 0
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
