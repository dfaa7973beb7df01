"""Rank bodies for the MoE test model (EP x expert-DP on Gloo); imported by spawned ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scout_core.decision.signature import signature_many
from scout_core.testing.models import batch
from scout_core.testing.moe_models import MoESpec, TinyMoE, moe_parallel, moe_train_step

UNIFORM = (MoESpec(4, 32), MoESpec(4, 32))
HETERO = (MoESpec(4, 32), MoESpec(2, 16), MoESpec(8, 24))


def _sig(params: Any) -> str:
    return f"{signature_many([p.detach() for p in params]):016x}"


def train_moe(steps: int, ep_size: int) -> dict[str, Any]:
    """Train the uniform and the heterogeneous TinyMoE a few steps; report what to compare."""
    rank = dist.get_rank()
    parallel = moe_parallel(ep_size)
    out: dict[str, Any] = {"ep_rank": parallel.ep_rank}
    for name, specs in (("uniform", UNIFORM), ("hetero", HETERO)):
        model = TinyMoE(specs, parallel=parallel, seed=3)
        reference = TinyMoE(specs, parallel=None, seed=3)  # every expert, one process
        start = _sig(model.expert_parameters())
        with torch.no_grad():
            tokens = batch(0, rank)[:, :-1]
            err = float((model(tokens) - reference(tokens)).abs().max())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = [moe_train_step(model, optimizer, s, rank, parallel) for s in range(steps)]
        out[name] = {
            "losses": [x.hex() for x in losses],
            "dense": _sig(model.dense_parameters()),
            "experts": _sig(model.expert_parameters()),
            "experts_at_start": start,
            "expert_ids": [list(layer.expert_ids) for _, layer in model.moe_layers()],
            "tokens_per_expert": [
                list(layer.last_tokens_per_expert) for _, layer in model.moe_layers()
            ],
            "reference_error": err,
        }
    return out
