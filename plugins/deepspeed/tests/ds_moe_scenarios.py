"""Rank body for DeepSpeed MoE on the core's router and expert recipes; returns JSON.

:class:`~ds_parallel_scenarios.MoELM` with ``EXPERTS`` experts per MoE layer (two
local experts per rank at ep_size 2), trained by a real DeepSpeed engine under
ZeRO-1 with the ``router`` and ``experts`` recipes on a shape catalog written by
``scout catalog discover --model`` (:func:`catalog_model`).

A fault ``{"rank", "step", "kind", "layer"}`` acts on one rank from that step on,
re-applied before every forward (ZeRO-1 copies the all-gathered parameters back into
the module after each step, so a corruption of the module's weight lasts until the
next step; re-applying it makes it persistent): ``expert_weight`` sets row 0 of local
expert 0's ``fc1.weight`` in MoE layer ``layer`` to 0.5; ``router_weight`` sets row 0
of that layer's gate ``wg.weight`` to 10 (expert 0 then wins most tokens).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from ds_parallel_scenarios import DIM, MICRO, SEQ, _build, _section, _train_step

EP = 2
EXPERTS = 4
"""Experts per MoE layer: two local experts per rank at ep_size 2."""


def catalog_model(layers: int = 2) -> list[dict[str, Any]]:
    """The ``--model`` file of ``scout catalog discover`` for :class:`MoELM`: one entry
    per ``MOELayer`` (path ``layers.<i>.moe.deepspeed_moe``), experts ``DIM -> 2 DIM ->
    DIM`` (not gated), at most every token of the EP group on one expert."""
    return [
        {
            "name": f"layers.{i}.moe.deepspeed_moe",
            "num_experts": EXPERTS,
            "ep_size": EP,
            "d_model": DIM,
            "d_ff": 2 * DIM,
            "gated": False,
            "max_tokens_per_expert": MICRO * SEQ * EP,
        }
        for i in range(layers)
    ]


def _arm(engine: Any, rank: int, faults: list[dict[str, Any]], step: list[int]) -> None:
    for f in faults:
        if f["rank"] != rank:
            continue
        moe = engine.module.layers[f["layer"]].moe.deepspeed_moe
        if f["kind"] == "expert_weight":
            module = moe.experts.deepspeed_experts[0]
            weight, value = module.fc1.weight, 0.5
        else:
            module = moe.gate
            weight, value = module.wg.weight, 10.0

        def corrupt(
            _m: torch.nn.Module, _a: Any, w: Any = weight, at: int = f["step"], v: float = value
        ) -> None:
            if step[0] >= at:
                with torch.no_grad():
                    w[0] = v

        module.register_forward_pre_hook(corrupt)


def moe_recipes_run(
    faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any]
) -> dict[str, Any]:
    """Train ``steps`` iterations with the router/expert recipes and ``faults``."""
    import scout_deepspeed

    rank = dist.get_rank()
    engine = _build("moe", 1, _section(**cfg), EP, experts=EXPERTS)
    session = scout_deepspeed.session_of(engine)
    assert session is not None and session.adapter is not None and session.replay is not None
    special = {k: v.path for k, v in session.adapter.special_modules().items()}
    step = [0]
    _arm(engine, rank, faults, step)
    for s in range(steps):
        step[0] = s
        _train_step(engine, "moe", s, rank, EP)
    out = {
        "rank": rank,
        "verdicts": [r.to_dict() for r in session.verdicts],
        "special": special,
        "layers": [ref.path for ref in session.adapter.repeated_layers()],
        "catalog": [[r.kind, r.path] for r in session.replay.schedule.catalog],
        "peers": list(session.adapter.layout().replica_group(rank)),
    }
    session.close()
    return out
