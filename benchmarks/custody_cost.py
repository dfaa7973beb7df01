"""Parameter custody's cost per training step, printed as JSON.

    python benchmarks/custody_cost.py [--layers 12 32 64] [--slices 1 16 64 256]
        [--steps 30] [--device cpu|cuda]

One process trains ``healthy_path``'s model (``--layers`` blocks of self-attention plus
MLP, dim 128, AdamW, one CPU thread) and times, per step, the whole step and the time
spent inside custody's two optimizer hooks (:mod:`scout_core.replay.custody`: the
post-step signing and the pre-step check), plus :meth:`Custody.collect`, which the
driver runs at each boundary. Custody is local (no collective), so one process
measures it exactly; timing its hooks directly rather than as a difference of step
times keeps the figure above the machine's jitter. ``slices = 0`` is the baseline: the
same loop without custody. Every figure is the median over the steps after two
warm-up steps.
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


def _run(layers: int, slices: int, steps: int, device: str) -> dict[str, Any]:
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
    custody = Custody([opt], slices=slices, step=lambda: clock[0]) if slices else None
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
    params = sum(p.numel() for p in model.parameters())
    warm = 2
    return {
        "layers": layers,
        "slices": slices,
        "params": params,
        "step_ms": 1e3 * statistics.median(step_s[warm:]),
        "custody_us": 1e6 * statistics.median(hook_s[warm:]),
        "share": statistics.median(hook_s[warm:]) / statistics.median(step_s[warm:]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[32])
    p.add_argument("--slices", type=int, nargs="+", default=[0, 1, 16, 64, 256])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = [
        _run(layers, slices, args.steps, args.device)
        for layers in args.layers
        for slices in args.slices
    ]
    print(json.dumps({"device": args.device, "threads": 1, "runs": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
