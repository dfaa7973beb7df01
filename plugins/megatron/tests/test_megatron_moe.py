"""megatron-core ``MoELayer`` on the core's router and expert recipes (CPU, Gloo).

A real ``GPTModel`` with two MoE layers (4 experts, top-2, ``SequentialMLP``), DP 3
with EP 1: every rank holds every expert, so the expert-data-parallel group is the
data-parallel group {0, 1, 2}, SCOUT's replica peers. (EP > 1 does not run on CPU:
Megatron's token dispatchers allocate on ``torch.cuda.current_device()`` and the
alltoall one creates a CUDA stream.) The catalog comes from ``scout catalog discover
--model`` over the two ``decoder.layers.<i>.mlp`` layers. After step 1, rank 2's
local expert 0 of layer 0 and rank 1's router of layer 1 are corrupted: the expert
fault is an ``sdc`` naming rank 2 on the ``experts/decoder.layers.0.mlp.experts@...``
surfaces within one catalog rotation, the router fault one naming rank 1 on the
router's surfaces; nothing else is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scout_core.testing import discover_catalog, distinct_verdicts, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(150)
def test_expert_and_router_faults_on_a_megatron_moe_gpt(tmp_path: Path) -> None:
    from mg_moe_scenarios import catalog_model, moe_run

    over = {
        "moe_catalog": discover_catalog(catalog_model(), tmp_path),
        "recipes": ["router", "experts"],
        "expert_interval": 1,
        "router_interval": 1,
    }
    faults = [
        {"rank": 2, "step": 1, "kind": "expert_weight", "layer": 0},
        {"rank": 1, "step": 1, "kind": "router_weight", "layer": 1},
    ]
    results = run_ranks(moe_run, 3, args=(faults, 6, over), timeout_s=130, env=ENV)
    for res in results:
        assert res["peers"] == [0, 1, 2]
        assert res["special"] == {
            "embedding": "embedding",
            "lm_head": "output_layer",
            "router:0": "decoder.layers.0.mlp.router",
            "router:1": "decoder.layers.1.mlp.router",
            "experts:0": "decoder.layers.0.mlp.experts",
            "experts:1": "decoder.layers.1.mlp.experts",
        }
    assert results[2]["fired"] == [["expert_weight", 1]]
    rotation = [p for kind, p in results[0]["catalog"] if kind == "experts"]
    assert {p.split("@")[0] for p in rotation} == {
        f"decoder.layers.{i}.mlp.experts" for i in range(2)
    }
    verdicts = distinct_verdicts(results)
    expert = [v for v in verdicts if v[1].startswith("experts/decoder.layers.0.mlp.experts@")]
    router = [v for v in verdicts if v[1].startswith("layer/decoder.layers.1.mlp.router/")]
    assert expert and router, verdicts
    assert {(v[2], tuple(v[3])) for v in expert} == {("sdc", (2,))}
    assert {(v[2], tuple(v[3])) for v in router} == {("sdc", (1,))}
    assert len(expert) + len(router) == len(verdicts), verdicts
    assert min(v[0] for v in expert) - 1 < len(rotation)
    assert {v[1].rsplit("/", 1)[1] for v in expert} >= {"params", "forward", "param_grad"}
    assert {v[1].rsplit("/", 1)[1] for v in router} >= {"forward", "weights", "topk"}


def _check_refusal(out: dict[str, Any], cls: str) -> None:
    assert out["experts_class"] == cls
    assert {k: v for k, v in out["special"].items() if ":" in k} == {
        "router:0": "decoder.layers.0.mlp.router",
        "router:1": "decoder.layers.1.mlp.router",
        "experts:0": "decoder.layers.0.mlp.experts",
    }
    (line,) = out["warnings"]
    assert line.startswith(
        f"the experts of MoE layer decoder.layers.1.mlp are not replayed: {cls} "
    )
    assert "one grouped GEMM" in line and "its router is replayed" in line


@pytest.mark.timeout(120)
def test_grouped_experts_are_refused_with_a_reason_and_the_router_kept() -> None:
    """Layer 1's experts without a module per expert (``GroupedMLP``'s shape; the real
    class needs CUDA's ``grouped_gemm``, see the ``gpu`` test): no ``experts:1`` part,
    one warning naming the layer, the class and why; both routers stay."""
    from mg_moe_scenarios import grouped_refusal

    (out,) = run_ranks(grouped_refusal, 1, args=(True,), timeout_s=100, env=ENV)
    _check_refusal(out, "_OneGemmExperts")


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_real_grouped_mlp_is_refused_on_a_gpu_host() -> None:
    import importlib.util

    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("grouped_gemm") is None:
        pytest.skip("needs CUDA and the grouped_gemm package (Megatron's GroupedMLP)")
    from mg_moe_scenarios import grouped_refusal

    (out,) = run_ranks(grouped_refusal, 1, args=(False,), timeout_s=280)
    _check_refusal(out, "GroupedMLP")


def test_a_replayed_router_leaves_megatron_aux_loss_logging_as_it_was(megatron_core: None) -> None:
    """A router forward with a load-balancing or z-loss adds it into Megatron's MoE
    logging tracker; the adapter's call of a router part restores the tracker after
    it, and leaves the expert part's and any other call's effects alone."""
    import torch
    from megatron.core.transformer.moe import moe_utils
    from scout_megatron.moe import MoeParts, _loss_entries, call_part

    from scout_core.plugin_api import ModuleRef

    router, experts = torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    parts = MoeParts([ModuleRef("r", router)], [ModuleRef("e", experts)])
    tracker, values_of = _loss_entries()  # the tracker of this megatron-core release
    tracker.clear()
    try:  # how a router records its losses: 0.17 and later
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

        save = get_moe_metrics_tracker().record
    except ImportError:  # 0.16
        save = moe_utils.save_to_aux_losses_tracker
    save("load_balancing_loss", torch.tensor(0.5), 1, 2)

    def forward_with_losses() -> str:
        save("load_balancing_loss", torch.tensor(0.25), 1, 2)
        save("z_loss", torch.tensor(1.0), 2, 2)
        return "routed"

    try:
        assert call_part(parts, router, forward_with_losses) == "routed"
        assert set(tracker) == {"load_balancing_loss"}
        assert values_of(tracker["load_balancing_loss"]).tolist() == [0.5, 0.0]
        out = call_part(parts, experts[0], lambda: (torch.ones(1), torch.ones(1)))
        assert out.tolist() == [2.0]  # an expert's (output, bias): one tensor
        call_part(parts, torch.nn.Linear(1, 1), forward_with_losses)  # not a part
        assert values_of(tracker["load_balancing_loss"]).tolist() == [0.75, 0.0]
    finally:
        tracker.clear()
