"""Megatron facts that need CUDA: real RNG tracker, Megatron DDP, optimizer wrappers.

Skipped without CUDA (run on a GPU host with ``pytest -m gpu``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scout_core.testing import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.timeout(400)
def test_megatron_facts_on_cuda(tmp_path: Path) -> None:
    from mg_gpu_scenarios import gpu_facts

    (out,) = run_ranks(
        gpu_facts, 1, args=(str(tmp_path / "ckpt"),), timeout_s=380, init_process_group=False
    )
    assert out["tracker"] == "CudaRNGStatesTracker"
    assert out["streams"] == [
        "megatron:data-parallel-rng",
        "megatron:expert-parallel-rng",
        "megatron:model-parallel-rng",
    ]
    assert out["state"] == ["torch.uint8", "cpu"] and out["rng_restored"]
    fp32, bf16, distopt = out["fp32"], out["bf16"], out["distopt"]
    assert fp32["top"] == bf16["top"] == distopt["top"] == "ChainedOptimizer"
    assert fp32["inner"] == [["FP32Optimizer", "AdamW", False]]
    assert fp32["inner_params_are_model_params"]
    assert bf16["inner"] == [["Float16OptimizerWithFloat16Params", "AdamW", False]]
    assert not bf16["inner_params_are_model_params"] and bf16["inner_dtypes"] == ["torch.float32"]
    assert distopt["inner"] == [["DistributedOptimizer", "AdamW", True]]
    assert not distopt["inner_params_are_model_params"]
    assert distopt["inner_dtypes"] == ["torch.float32"]
    for facts in (fp32, bf16, distopt):
        assert facts["model_params_changed_after_step"]
    # Wrappers with fp32 main copies update the model only after the inner step.
    assert fp32["model_params_changed_at_post_hook"]
    assert not bf16["model_params_changed_at_post_hook"]
    assert not distopt["model_params_changed_at_post_hook"]
    assert out["recompute_hooks"] == {"1": [1, 1], "2": [1, 1]}
    assert out["distopt_checkpoint"] == {
        "tags": ["iter_0000001"],
        "moved": True,
        "restored": True,
    }
