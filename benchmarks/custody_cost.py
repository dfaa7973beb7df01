"""Parameter custody's cost per training step, printed as JSON.

    python benchmarks/custody_cost.py [--layers 12 32 64] [--slices 1 16 64 256]
        [--every 1 8 16] [--steps 30] [--device cpu|cuda]

One process trains ``healthy_path``'s model (``--layers`` blocks of self-attention plus
MLP, dim 128, AdamW, one CPU thread) and times, per step, the whole step and the time
spent inside custody's two optimizer hooks (:mod:`scout_core.replay.custody`: the
post-step signing and the pre-step check), plus :meth:`Custody.collect`, which the
driver runs at each boundary. Custody is local (no collective), so one process
measures it exactly; timing its hooks directly rather than as a difference of step
times keeps the figure above the machine's jitter. ``slices = 0`` is the baseline: the
same loop without custody. ``--every`` runs each ``--slices`` value once per
``custody_every`` (custody works at one step in that many). The step time is the median
over the steps after two warm-up steps; custody's time per step is the *mean* over
those steps (a whole number of ``every`` periods, so working and idle steps count in
their share), and ``working_us`` the median over the steps in which custody checked
or signed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from healthy_path import Model  # the same model as the healthy-path run

from scout_core.replay.custody import Custody


def _run(layers: int, slices: int, every: int, steps: int, device: str) -> dict[str, Any]:
    torch.manual_seed(0)
    vocab = 256
    model = Model(vocab, 128, layers, heads=4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    clock = [0]
    inside = [0.0]
    mark = [0.0]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def enter(*_: Any) -> None:
        sync()
        mark[0] = time.perf_counter()

    def leave(*_: Any) -> None:
        sync()
        inside[0] += time.perf_counter() - mark[0]

    # enter/leave bracket custody's own hooks (registered between them), pre and post.
    opt.register_step_pre_hook(enter)
    opt.register_step_post_hook(enter)
    custody = Custody([opt], slices=slices, every=every, step=lambda: clock[0]) if slices else None
    opt.register_step_pre_hook(leave)
    opt.register_step_post_hook(leave)
    step_s: list[float] = []
    hook_s: list[float] = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, vocab, (8, 65), generator=gen).to(device)
        sync()
        t0 = time.perf_counter()
        inside[0] = 0.0
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if custody is not None:
            enter()
            assert custody.collect() == []  # a healthy step: nothing changed
            leave()
        sync()
        step_s.append(time.perf_counter() - t0)
        hook_s.append(inside[0])
        clock[0] += 1
    every = custody.every if custody is not None else 1
    params = sum(p.numel() for p in model.parameters())
    return {"layers": layers, "slices": slices, **_summary(step_s, hook_s, every, params)}


def _summary(step_s: list[float], hook_s: list[float], every: int, params: int) -> dict[str, Any]:
    steps = len(step_s)
    warm = 2
    # whole periods only: from the first working step after the warm-up
    first = warm + (-warm) % every
    timed = hook_s[first : first + (steps - first) // every * every]
    if not timed:
        raise SystemExit(f"--steps {steps} holds no whole period of {every} after warm-up")
    # a working step signs (post-hook) and the step after it checks (pre-hook)
    working = [h for i, h in enumerate(hook_s) if i >= warm and i % every in (0, 1 % every)]
    mean = statistics.fmean(timed)
    step_med = statistics.median(step_s[warm:])
    return {
        "every": every,
        "params": params,
        "step_ms": 1e3 * step_med,
        "custody_us": 1e6 * mean,
        "working_us": 1e6 * statistics.median(working),
        "share": mean / step_med,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[32])
    p.add_argument("--slices", type=int, nargs="+", default=[0, 1, 16, 64, 256])
    p.add_argument("--every", type=int, nargs="+", default=[1])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = [
        _run(layers, slices, every, args.steps, args.device)
        for layers in args.layers
        for slices in args.slices
        for every in (args.every if slices else [1])
    ]
    print(json.dumps({"device": args.device, "threads": 1, "runs": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
