"""Test and example support for running real megatron-core on CPU (never in a GPU job).

* :mod:`scout_megatron.testing.shims`: the CPU shims (memory buffer, RNG tracker,
  recompute RNG, ``dist_checkpointing`` on CPU, the CUDA-device rewrite around the
  optimizer) and :func:`install_cpu_shims`;
* :mod:`scout_megatron.testing.gpt`: a tiny ``GPTModel`` trained with torch DDP over
  Megatron's data-parallel group and Megatron's ``ChainedOptimizer([FP32Optimizer])``.

Importing this package imports megatron-core.
"""

from __future__ import annotations

from scout_megatron.testing.gpt import (
    Batch,
    TinyGPT,
    build_model,
    build_optimizer,
    digest,
    get_batch,
    initialize,
    teardown,
    train_step,
    transformer_config,
    wrap_ddp,
)
from scout_megatron.testing.shims import (
    CpuMemoryBuffer,
    CpuRNGStatesTracker,
    cpu_dist_checkpointing,
    cpu_recompute_rng,
    cuda_factories_on_cpu,
    install_cpu_shims,
)

__all__ = [
    "Batch",
    "TinyGPT",
    "build_model",
    "build_optimizer",
    "digest",
    "get_batch",
    "initialize",
    "teardown",
    "train_step",
    "transformer_config",
    "wrap_ddp",
    "CpuMemoryBuffer",
    "CpuRNGStatesTracker",
    "cpu_dist_checkpointing",
    "cpu_recompute_rng",
    "cuda_factories_on_cpu",
    "install_cpu_shims",
]
