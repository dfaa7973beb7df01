"""Rank body for megatron-core MoE on the core's router and expert recipes; returns JSON.

A real ``GPTModel`` of :mod:`scout_megatron.testing` whose every layer's MLP is an
``MoELayer`` (``EXPERTS`` experts, top-2, ``SequentialMLP``), data parallel over all
ranks with EP 1 (so the expert-data-parallel group is the data-parallel group, and
SCOUT's replica peers hold the same experts), SCOUT attached with the ``router`` and
``experts`` recipes on a catalog written by ``scout catalog discover --model``
(:func:`catalog_model`).

A fault ``{"rank", "step", "kind", "layer"}`` acts on one rank after that step's
optimizer step and persists (the optimizer steps on the module's own fp32 weights):
``expert_weight`` adds 1.0 to an element of local expert 0's ``linear_fc1.weight``
in layer ``layer``; ``router_weight`` adds 1.0 to an element of that layer's router
weight.
"""

from __future__ import annotations

from typing import Any

import torch

EXPERTS = 4


def catalog_model(layers: int = 2, hidden: int = 32, tokens: int = 32) -> list[dict[str, Any]]:
    """The ``--model`` file of ``scout catalog discover``: one entry per ``MoELayer``
    (``decoder.layers.<i>.mlp``), experts ``hidden -> hidden -> hidden`` (not gated),
    EP 1, at most every token of a micro-batch on one expert."""
    return [
        {
            "name": f"decoder.layers.{i}.mlp",
            "num_experts": EXPERTS,
            "ep_size": 1,
            "d_model": hidden,
            "d_ff": hidden,
            "gated": False,
            "max_tokens_per_expert": tokens,
        }
        for i in range(layers)
    ]


def _fire(model: Any, fault: dict[str, Any]) -> None:
    moe = model.decoder.layers[fault["layer"]].mlp
    with torch.no_grad():
        if fault["kind"] == "expert_weight":
            moe.experts.local_experts[0].linear_fc1.weight[0, 0] += 1.0
        else:
            moe.router.weight[0, 0] += 1.0


def moe_run(faults: list[dict[str, Any]], steps: int, over: dict[str, Any]) -> dict[str, Any]:
    """Train ``steps`` iterations with SCOUT's MoE recipes and ``faults``."""
    import scout_megatron
    from mg_scout_scenarios import section
    from scout_megatron import testing as mgt

    from scout_core import Config

    rank = torch.distributed.get_rank()
    mgt.initialize(tensor_model_parallel_size=1, seed=1234)
    spec = mgt.TinyGPT(num_moe_experts=EXPERTS)
    model = mgt.build_model(spec)
    ddp, opt = mgt.wrap_ddp(model), mgt.build_optimizer([model])
    session = scout_megatron.attach([ddp], opt, Config(**section(**over)))
    assert session.adapter is not None and session.replay is not None
    special = {k: v.path for k, v in session.adapter.special_modules().items()}
    fired = []
    for step in range(steps):
        mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
        for f in faults:
            if f["rank"] == rank and f["step"] == step:
                _fire(model, f)
                fired.append([f["kind"], step])
    out = {
        "rank": rank,
        "verdicts": [r.to_dict() for r in session.verdicts],
        "special": special,
        "fired": fired,
        "catalog": [[r.kind, r.path] for r in session.replay.schedule.catalog],
        "peers": list(session.adapter.layout().replica_group(rank)),
    }
    session.close()
    return out


class _OneGemmExperts(torch.nn.Module):
    """Stands in for ``GroupedMLP`` on CPU (which needs the CUDA ``grouped_gemm``
    package to be built): every local expert's weights in one tensor, no module per
    expert, exactly what makes Megatron's grouped experts unreplayable one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.weight1 = torch.nn.Parameter(torch.zeros(32, EXPERTS * 32))


def grouped_refusal(stand_in: bool) -> dict[str, Any]:
    """The parts and the warning of a model whose layer 1 has grouped experts: a real
    ``GroupedMLP`` (``stand_in`` False, on a GPU host) or :class:`_OneGemmExperts`."""
    import logging

    from scout_megatron import testing as mgt
    from scout_megatron.adapter import discover

    from scout_core import Config

    mgt.initialize(tensor_model_parallel_size=1, seed=1234)
    msgs: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msgs.append(record.getMessage())

    logging.getLogger("scout_megatron.moe").addHandler(Keep())
    model: Any = mgt.build_model(
        mgt.TinyGPT(num_moe_experts=EXPERTS, moe_grouped_gemm=not stand_in)
    )
    if stand_in:
        model.decoder.layers[1].mlp.experts = _OneGemmExperts()
    found = discover([model], Config())
    return {
        "special": {k: v.path for k, v in found.special().items()},
        "warnings": msgs,
        "experts_class": type(model.decoder.layers[1].mlp.experts).__name__,
    }
