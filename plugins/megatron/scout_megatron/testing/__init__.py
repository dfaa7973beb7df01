"""Test and example support for running real megatron-core on CPU (never in a GPU job).

* :mod:`scout_megatron.testing.shims`: the CPU shims (memory buffer, RNG tracker,
  recompute RNG, ``dist_checkpointing`` on CPU, the CUDA-device rewrite around the
  optimizer) and :func:`install_cpu_shims`;
* :mod:`scout_megatron.testing.gpt`: a tiny ``GPTModel`` trained with torch DDP over
  Megatron's data-parallel group and Megatron's ``ChainedOptimizer([FP32Optimizer])``;
* :mod:`scout_megatron.testing.bridge_loop`: a training loop that fires Megatron-Bridge's
  callback events the way Bridge's ``train()`` does.

This package re-exports the names of the first two. Importing it imports megatron-core.
"""

from __future__ import annotations

from scout_megatron.testing import gpt, shims
from scout_megatron.testing.gpt import *  # noqa: F403  # the names in gpt.__all__
from scout_megatron.testing.shims import *  # noqa: F403  # the names in shims.__all__

__all__ = gpt.__all__ + shims.__all__
