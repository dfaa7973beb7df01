"""Checkpoint-gate cost: blocking time per in-memory capture and amortized overhead.

    python benchmarks/checkpoint_capture.py [--layers 8] [--width 512] [--steps 200]
        [--interval 20] [--warmup 10] [--checkpoint-dir DIR]

One process (a one-rank Gloo job, so the gate's job-wide combine really runs)
trains a stack of ``--layers`` linear blocks of ``--width`` with AdamW, in one run:

* ``without``: ``--steps`` plain training steps;
* ``with``: the same steps, and at every ``--interval``-th step (the default replay
  cadence, ``Config.replay_interval``) the gate's boundary: the flag combine, the
  in-memory capture of model + AdamW + RNG + caller state and, when the catalog
  cycle closes, rotation (and persistence with ``--checkpoint-dir``).

The two phases alternate in blocks of ``--interval`` steps so neither always runs
on a warmer machine. It prints one JSON object: the capture's blocking time per
boundary (median, p90, max: on CPU it is a host clone; on CUDA the copy runs on a
side stream and the blocking time is only the time to enqueue it), the mean step
time with and without (means and medians), the measured amortized overhead
``(mean with - mean without) / mean without`` and the predicted one
``median boundary / (interval * mean step)``. On a shared machine the measured
figure is dominated by noise; the predicted one is the stable estimate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any, Any, int, str]:
    """Model, AdamW, a batch and the gate's coordinator on a one-rank Gloo job."""
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
    catalog = args.layers + 3  # rotated layers + embedding + LM head + optimizer
    coord = CheckpointCoordinator(
        model,
        [opt],
        rng_streams=default_rng_streams(),
        catalog_size=catalog,
        group=diagnostic_group([0]),
        ranks=[0],
        run_id="bench",
        checkpoint_dir=args.checkpoint_dir,
    )
    return model, opt, batch, coord, catalog, device


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from scout_core.decision.gate import Outcome

    model, opt, batch, coord, catalog, device = _setup(args)
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
    times: dict[str, list[float]] = {"plain": [], "gated": [], "boundary": [], "capture": []}
    held: list[int] = []
    for block in range(2 * (args.steps // args.interval)):
        scout_on = block % 2 == 1  # alternate blocks: neither phase always runs warmer
        for i in range(args.interval):
            sync()
            t0 = time.monotonic()
            step()
            if scout_on and i == args.interval - 1:
                n = len(times["boundary"])
                extra["step"] = n
                b0 = time.monotonic()
                result = coord.on_boundary(n, Outcome.CLEAN, n % catalog, extra=extra)
                times["boundary"].append(time.monotonic() - b0)
                times["capture"].append(result.capture_s)
                held.append(_held(coord.memory))
            sync()
            times["gated" if scout_on else "plain"].append(time.monotonic() - t0)
    coord.close()
    snap = coord.memory.latest
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state += sum(
        v.numel() * v.element_size()
        for st in opt.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor)
    )
    return {
        "device": device,
        "params": sum(p.numel() for p in model.parameters()),
        "snapshot_bytes": 0 if snap is None else snap.nbytes(),
        "state_bytes": state,
        "held_bytes_peak": max(held, default=0),
        "held_bytes_end": held[-1] if held else 0,
        "catalog_size": catalog,
        **times,
    }


def _held(memory: Any) -> int:
    """Host bytes the gate holds: its distinct generations (and, where the checkout has
    one, its buffer pool: ``held_bytes``)."""
    held = getattr(memory, "held_bytes", None)
    if callable(held):
        return int(held())
    snaps = {id(g): g for g in (memory.latest, memory.candidate, memory.verified) if g}
    return sum(int(g.nbytes()) for g in snaps.values())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure both phases in one run and summarise them."""
    import torch.distributed as dist

    try:
        m = _measure(args)
    finally:
        dist.destroy_process_group()
    plain, gated = statistics.fmean(m["plain"]), statistics.fmean(m["gated"])
    capture, boundary = m["capture"], m["boundary"]
    p90 = (
        statistics.quantiles(capture, n=10, method="inclusive")[-1]
        if len(capture) >= 2
        else max(capture)
    )
    return {
        "device": m["device"],
        "params": m["params"],
        "snapshot_bytes": m["snapshot_bytes"],
        # Host memory the gate holds on this rank, and as a multiple of the live model +
        # optimizer state (one generation is ~1x; latest, candidate and verified ~3x).
        "state_bytes": m["state_bytes"],
        "held_bytes_peak": m["held_bytes_peak"],
        "held_over_state_peak": m["held_bytes_peak"] / max(1, m["state_bytes"]),
        "held_over_state_end": m["held_bytes_end"] / max(1, m["state_bytes"]),
        "interval": args.interval,
        "catalog_size": m["catalog_size"],
        "boundaries": len(boundary),
        "capture_blocking_ms": {
            "median": 1e3 * statistics.median(capture),
            "p90": 1e3 * p90,
            "max": 1e3 * max(capture),
        },
        "boundary_ms_median": 1e3 * statistics.median(boundary),
        "step_ms_without": 1e3 * plain,
        "step_ms_with": 1e3 * gated,
        # Medians resist a busy machine's preemption spikes; the boundary itself is
        # one step in ``interval``, so it shows in the means, not the medians.
        "step_ms_median_without": 1e3 * statistics.median(m["plain"]),
        "step_ms_median_with": 1e3 * statistics.median(m["gated"]),
        "overhead_measured": (gated - plain) / plain,
        "overhead_predicted": statistics.median(boundary) / (args.interval * plain),
        "durable": args.checkpoint_dir is not None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--steps", type=int, default=200, help="steps per phase")
    p.add_argument("--interval", type=int, default=20, help="steps between replay boundaries")
    p.add_argument("--warmup", type=int, default=10)
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
