"""Rank body for the MoE incident run (``test_deepspeed_incidents.py``); returns JSON.

The coupled-region fault of ``docs/deepspeed.md``: one rank's expert computes with
corrupted weights, so the tokens its expert-parallel partner routes to that expert
come back wrong through the second all-to-all, and both ranks' replica groups name
their member. The weight is re-corrupted before every forward (DeepSpeed's ZeRO-1
all-gather rewrites the module copy after each step), to the same value each time.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from ds_parallel_scenarios import _build, _Expert, _section, _train_step


def moe_expert_weight(culprit: int, layer: int, steps: int) -> dict[str, Any]:
    import scout_deepspeed

    rank = dist.get_rank()
    engine = _build("moe", 1, _section(recipes=["hidden"]), 2)
    session = scout_deepspeed.session_of(engine)
    assert session is not None
    experts = [m for m in engine.module.layers[layer].modules() if isinstance(m, _Expert)]
    assert len(experts) == 1  # one local expert per rank
    if rank == culprit:
        weight = experts[0].fc1.weight

        def corrupt(module: torch.nn.Module, args: Any) -> None:
            with torch.no_grad():
                weight[0, 0] = 0.5

        experts[0].register_forward_pre_hook(corrupt)
    for step in range(steps):
        _train_step(engine, "moe", step, rank, 2)
    out = {
        "rank": rank,
        "verdicts": [r.to_dict() | {"id": r.id} for r in session.verdicts],
        "incidents": [r.to_dict() | {"id": r.id} for r in session.incidents],
    }
    session.close()
    return out
