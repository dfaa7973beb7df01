"""Framework facts against real megatron-core on TP=2: blocks, optimizers, RNG, recompute."""

from __future__ import annotations

import pytest

from scout_core.testing import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # CI's set: docs/megatron.md, Tests

ENV = {"OMP_NUM_THREADS": "1"}

STREAMS = [
    "megatron:data-parallel-rng",
    "megatron:expert-parallel-rng",
    "megatron:model-parallel-rng",
]


@pytest.mark.timeout(180)
def test_facts_on_a_tp2_gpt() -> None:
    from mg_facts_scenarios import facts_tp2

    results = run_ranks(facts_tp2, 2, timeout_s=170, env=ENV)
    for out in results:
        assert out["chunk"] == {
            "root_is_model": True,
            "layers": [1, 2],
            "layer_class": "TransformerLayer",
            "embedding": "LanguageModelEmbedding",
            "output_layer": "ColumnParallelLinear",
            "shared": False,
        }
        assert out["inner"] == [["FP32Optimizer", "AdamW", 0, False]]
        assert out["inner_is_live"]
        assert out["stub_inner"] == 0
        assert out["chained_inner"] == [["FP32Optimizer", 0], ["FP32Optimizer", 1]]
        assert out["streams"] == STREAMS
        # Attention dropout forks the model-parallel stream; the others stay put.
        assert out["moved"] == {
            "megatron:data-parallel-rng": False,
            "megatron:expert-parallel-rng": False,
            "megatron:model-parallel-rng": True,
        }
        assert out["dropout_varies"] and out["restored_bitwise"] and out["get_is_copy"]
        # Without recompute each layer's hook fires once per step; with full recompute
        # it fires again in backward and exactly that firing is recognised.
        assert out["hooks_recompute_False"] == {"1": [1, 0], "2": [1, 0]}
        assert out["hooks_recompute_True"] == {"1": [1, 1], "2": [1, 1]}
    rank0, rank1 = (out["states"] for out in results)
    assert rank0["megatron:data-parallel-rng"] == rank1["megatron:data-parallel-rng"]
    assert rank0["megatron:model-parallel-rng"] != rank1["megatron:model-parallel-rng"]
