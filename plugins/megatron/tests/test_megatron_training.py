"""A real megatron-core GPTModel trains on CPU, DP3 x TP2 over Gloo, deterministically."""

from __future__ import annotations

import pytest

from scout_core.testing import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # CI's set: docs/megatron.md, Tests

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(180)
def test_gpt_dp3_tp2_trains_bitwise_reproducibly() -> None:
    from mg_train_scenarios import train_twice

    results = run_ranks(train_twice, 6, args=(3, 0.1), timeout_s=170, env=ENV)
    for rank, out in enumerate(results):
        assert out["types"] == ["ChainedOptimizer", "FP32Optimizer", "AdamW"]
        # Megatron's order tp-cp-ep-dp-pp: TP ranks are contiguous.
        assert (out["tp"], out["dp"]) == (rank % 2, rank // 2)
        first, second = out["runs"]
        assert first == second, f"rank {rank}: two runs from one seed differ"
    by_tp: dict[int, set[str]] = {}
    for out in results:
        by_tp.setdefault(out["tp"], set()).add(out["runs"][0]["digest"])
    # Data-parallel replicas hold bitwise-equal weights and Adam state; TP shards differ.
    assert all(len(d) == 1 for d in by_tp.values())
    assert by_tp[0] != by_tp[1]
    # Replicas saw different batches, so the losses differ across DP ranks.
    assert len({tuple(out["runs"][0]["losses"]) for out in results if out["tp"] == 0}) == 3
