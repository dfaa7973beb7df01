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

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


def _catalog(tmp: Path) -> str:
    from mg_moe_scenarios import catalog_model

    model, out = tmp / "model.json", tmp / "catalog.json"
    model.write_text(json.dumps(catalog_model()), encoding="utf-8")
    cmd = [sys.executable, "-m", "scout_core", "catalog", "discover", "--model", str(model)]
    cmd += ["--dtype", "float32", "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return str(out)


def _verdicts(results: list[Any]) -> list[tuple[int, str, str, list[int]]]:
    seen = {
        (v["step"], v["surface"], v["failure"], tuple(v["outliers"]))
        for r in results
        for v in r["verdicts"]
    }
    return sorted((s, surf, str(f), list(o)) for s, surf, f, o in seen)


@pytest.mark.timeout(150)
def test_expert_and_router_faults_on_a_megatron_moe_gpt(tmp_path: Path) -> None:
    from mg_moe_scenarios import moe_run

    over = {
        "moe_catalog": _catalog(tmp_path),
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
    verdicts = _verdicts(results)
    expert = [v for v in verdicts if v[1].startswith("experts/decoder.layers.0.mlp.experts@")]
    router = [v for v in verdicts if v[1].startswith("layer/decoder.layers.1.mlp.router/")]
    assert expert and router, verdicts
    assert {(v[2], tuple(v[3])) for v in expert} == {("sdc", (2,))}
    assert {(v[2], tuple(v[3])) for v in router} == {("sdc", (1,))}
    assert len(expert) + len(router) == len(verdicts), verdicts
    assert min(v[0] for v in expert) - 1 < len(rotation)
    assert {v[1].rsplit("/", 1)[1] for v in expert} >= {"params", "forward", "param_grad"}
    assert {v[1].rsplit("/", 1)[1] for v in router} >= {"forward", "weights", "topk"}
