"""The derived layout matches the groups megatron-core's initialize_model_parallel builds."""

from __future__ import annotations

import pytest

from scout_core.testing import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # CI's set: docs/megatron.md, Tests

ENV = {"OMP_NUM_THREADS": "1"}

CONFIGS = [
    {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
    {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
        "order": "tp-cp-ep-pp-dp",
    },
    {"tensor_model_parallel_size": 2, "context_parallel_size": 2},
    {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2},
    {"tensor_model_parallel_size": 2, "num_distributed_optimizer_instances": 2},
]


@pytest.mark.timeout(240)
def test_layout_matches_live_megatron_groups_on_8_ranks() -> None:
    from mg_layout_scenarios import layouts_match_live_groups

    results = run_ranks(layouts_match_live_groups, 8, args=(CONFIGS,), timeout_s=230, env=ENV)
    for per_config in results:
        for config, out in zip(CONFIGS, per_config, strict=True):
            assert out["problem"] is None, (config, out["problem"])
            assert "tp" in out["groups"] and "dp_cp" in out["groups"]
    # Spot checks on rank 5; addresses are (d, s, t, p, c, e).
    tp_pp, tp_pp_vpp, tp_cp, tp_ep, tp_inst = results[5]
    assert tp_pp["address"] == [0, 0, 1, 1, 0, 0]  # 5 = t + 2d + 4p
    assert tp_pp_vpp["address"] == [1, 0, 1, 0, 0, 0]  # pipeline before data: 5 = t + 2p + 4d
    assert tp_pp_vpp["vpp"] == 2
    assert tp_cp["address"] == [1, 0, 1, 0, 0, 0] and tp_cp["groups"]["cp"] == [5, 7]
    assert tp_ep["address"] == [1, 0, 1, 0, 0, 0]  # 5 = t + 2e + 4d
    assert tp_ep["groups"]["expt_dp"] == [1, 5] and tp_ep["groups"]["dp"] == [1, 3, 5, 7]
    assert tp_inst["instances"] == 2 and tp_inst["groups"]["intra_dp_cp"] == [5, 7]
