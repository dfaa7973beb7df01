"""DeepSpeed MoE on the core's router and expert recipes (issue 13's DeepSpeed acceptance).

MoE ep_size 2 x expert-DP 3 under ZeRO-1 on 6 Gloo ranks: expert-parallel pairs
``[0,1] [2,3] [4,5]``, expert-DP peers ``[0,2,4]`` and ``[1,3,5]`` (SCOUT's replica
groups). Four experts per layer, two local ones per rank. The catalog comes from
``scout catalog discover --model`` over the two ``MOELayer`` s. From step 1 on, rank 4's
local expert 0 of layer 0 computes with a corrupted weight and rank 3's gate of layer
1 scores with a corrupted weight. The expert fault is an ``sdc`` naming rank 4 on the
``experts/layers.0.moe.deepspeed_moe.experts@...`` surfaces within one catalog
rotation, the router fault one naming rank 3 on the gate's router surfaces; nothing
else is reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scout_core.testing import discover_catalog, distinct_verdicts, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(150)
def test_expert_and_router_faults_through_the_plugin_ep2_by_expert_dp3(tmp_path: Path) -> None:
    from ds_moe_scenarios import catalog_model, moe_recipes_run

    cfg = {
        "moe_catalog": discover_catalog(catalog_model(), tmp_path),
        "recipes": ["router", "experts"],
        "expert_interval": 1,
        "router_interval": 1,
    }
    faults = [
        {"rank": 4, "step": 1, "kind": "expert_weight", "layer": 0},
        {"rank": 3, "step": 1, "kind": "router_weight", "layer": 1},
    ]
    steps = 6
    results = run_ranks(moe_recipes_run, 6, args=(faults, steps, cfg), timeout_s=130, env=ENV)
    for res in results:
        assert res["special"] == {
            "embedding": "embed",
            "lm_head": "head",
            "router:0": "layers.0.moe.deepspeed_moe.gate",
            "router:1": "layers.1.moe.deepspeed_moe.gate",
            "experts:0": "layers.0.moe.deepspeed_moe.experts",
            "experts:1": "layers.1.moe.deepspeed_moe.experts",
        }
        assert res["peers"] == [res["rank"] % 2, res["rank"] % 2 + 2, res["rank"] % 2 + 4]
    catalog = results[0]["catalog"]
    rotation = [p for kind, p in catalog if kind == "experts"]
    assert {p.split("@")[0] for p in rotation} == {
        f"layers.{i}.moe.deepspeed_moe.experts" for i in range(2)
    }
    verdicts = distinct_verdicts(results)
    expert = [v for v in verdicts if v[1].startswith("experts/layers.0.moe.deepspeed_moe.experts@")]
    router = [v for v in verdicts if v[1].startswith("layer/layers.1.moe.deepspeed_moe.gate/")]
    assert expert and router, verdicts
    assert {(v[2], tuple(v[3])) for v in expert} == {("sdc", (4,))}
    assert {(v[2], tuple(v[3])) for v in router} == {("sdc", (3,))}
    assert len(expert) + len(router) == len(verdicts), verdicts
    # Named within one rotation of the experts track after the fault (step 1).
    assert min(v[0] for v in expert) - 1 < len(rotation)
    assert {v[1].rsplit("/", 1)[1] for v in expert} >= {"params", "forward", "param_grad"}
    assert {v[1].rsplit("/", 1)[1] for v in router} >= {"forward", "weights", "topk"}
