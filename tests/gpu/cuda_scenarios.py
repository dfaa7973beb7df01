"""Rank bodies of the CUDA replay tests: several ranks share one GPU over Gloo.

NCCL refuses two ranks on one device, so these ranks keep the model and every tensor
on ``cuda:0`` and talk over Gloo (which carries CUDA tensors). What they check is the
CUDA path of replay itself: CUDA-event timing of ``t_M``, deterministic cuBLAS under
``CUBLAS_WORKSPACE_CONFIG``, and signatures of device tensors.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing.models import VOCAB, TinyLM, batch


def gpu_sleep_cycles(seconds: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` that keep the GPU busy about ``seconds``
    (measured after a warm-up launch, which pays CUDA's lazy start-up)."""
    probe = 50_000_000
    for _ in range(2):  # the first round warms up; the second is measured
        torch.cuda.synchronize()
        t0 = time.monotonic()
        torch.cuda._sleep(probe)  # type: ignore[no-untyped-call]  # unannotated in torch
        torch.cuda.synchronize()
        took = time.monotonic() - t0
    return int(probe * seconds / took)


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int, device: str) -> None:
    tokens = batch(step, rank).to(device)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]  # torch stub lacks annotations
    opt.step()


def _state(model: nn.Module) -> list[str]:
    from scout_core.decision.signature import signature

    return [f"{signature(p.detach()):016x}" for p in model.parameters()]


def scenario(
    fault: str, victim: int, steps: int, scout: bool, device: str = "cuda"
) -> dict[str, Any]:
    """Train ``steps`` DDP steps on ``device`` (``cuda``: ``cuda:0``; ``cpu`` dry-runs the
    bodies where there is no GPU) with SCOUT (or without) and ``fault`` on
    ``victim``: ``"bitflip"`` (an output bit of ``layers.2`` at step 2, when replay samples
    it), ``"gpu_slow"`` (a GPU busy kernel of 0.1 s before every block's forward, in
    training and replay: asynchronous, so only device timing sees it) or ``"none"``."""
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.testing.injectors import BitFlip, Faults

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        TinyLM().to(device), device_ids=[0] if device == "cuda" else None
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if fault == "bitflip":
        Faults().at(rank=victim, step=2).corrupt_output("layers.2", BitFlip(0)).attach(model, opt)
    if fault == "gpu_slow" and rank == victim:
        cycles = gpu_sleep_cycles(0.1)
        for block in model.module.layers:
            block.register_forward_pre_hook(lambda m, a: torch.cuda._sleep(cycles))  # type: ignore[no-untyped-call]
    if not scout:
        for step in range(steps):
            _step(model, opt, step, rank, device)
        return {"state": _state(model.module), "verdicts": []}
    cfg = Config(
        report_dir=os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        run_id="cuda",
        replay_interval=1,
        recipes=("hidden",),
        observer=False,
    )
    with enable_torch(model, opt, cfg) as session:
        for step in range(steps):
            _step(model, opt, step, rank, device)
        verdicts = [r.to_dict() for r in session.verdicts]
    return {
        "state": _state(model.module),
        "verdicts": verdicts,
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
