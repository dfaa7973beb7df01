"""The torch optimizers inside a Megatron optimizer, and what each of them sees.

``MegatronOptimizer`` (``megatron.core.optimizer.optimizer``) is not a
``torch.optim.Optimizer``; SCOUT hooks the torch optimizer(s) it drives:

* ``FP32Optimizer``, ``Float16OptimizerWithFloat16Params`` and
  ``DistributedOptimizer`` hold one in ``.optimizer`` (torch ``AdamW``/``Adam``/``SGD``
  here, TE or Apex ``FusedAdam`` on GPU hosts; all ``torch.optim.Optimizer``
  subclasses, so ``register_step_pre_hook``/``register_step_post_hook`` work);
* ``ChainedOptimizer`` (what ``get_megatron_optimizer`` returns in 0.16, even for one
  optimizer) holds them in ``.chained_optimizers``: dense and, with MoE, expert
  parameters. Its ``.optimizer`` property asserts there is exactly one, so it is
  never read here;
* a *stub* optimizer (``is_stub_optimizer``: a rank with no trainable parameters)
  has ``.optimizer = None`` and contributes nothing.

What the inner optimizer sees differs (:class:`InnerOptimizer.sharded`):

* ``FP32Optimizer``: the model's own fp32 parameters, replicated on every
  data-parallel rank, with gradients already averaged by DDP;
* ``Float16OptimizerWithFloat16Params``: fp32 master copies of the bf16/fp16
  parameters (``fp32_from_float16_groups``), replicated likewise;
* ``DistributedOptimizer``: fp32 *shards* (``shard_fp32_from_float16_groups`` /
  ``shard_fp32_groups``): each data-parallel rank of a distributed-optimizer
  instance owns a different contiguous range of the grad buffer, so its param
  groups hold different tensors of different sizes than its replicas'. The updated
  shards reach the model parameters only after ``step_with_ready_grads`` copies them
  back and all-gathers them (``start_param_sync``, or the next forward's pre-hooks
  with ``overlap_param_gather``), so a step post-hook sees updated shards but not yet
  updated model parameters. Optimizer replay can therefore cover the *update of this
  rank's shard* (element-wise: exact), compared with the ranks that hold the same
  shard: the same-position ranks of the other distributed-optimizer instances
  (``num_distributed_optimizer_instances`` > 1). With one instance no other rank
  holds the same optimizer state, so there is nothing to compare the shard with;
  the copy back to bf16 and the all-gather are never covered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scout_core import UnsupportedSetupError

__all__ = ["InnerOptimizer", "inner_optimizers", "torch_optimizers"]


@dataclass(frozen=True)
class InnerOptimizer:
    """One torch optimizer driven by a Megatron optimizer."""

    optimizer: torch.optim.Optimizer
    wrapper: str
    """Class name of the Megatron optimizer that drives it (``FP32Optimizer`` ...)."""
    index: int
    """Position among the inner optimizers, in ``chained_optimizers`` order."""
    sharded: bool
    """True under ``DistributedOptimizer``: the param groups hold this rank's fp32
    shards, not replicated tensors."""


def _walk(optimizer: Any, out: list[tuple[torch.optim.Optimizer, Any]]) -> None:
    if isinstance(optimizer, torch.optim.Optimizer):
        out.append((optimizer, None))
        return
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        for sub in chained:
            _walk(sub, out)
        return
    if getattr(optimizer, "is_stub_optimizer", False):
        return
    inner = getattr(optimizer, "optimizer", None)
    if inner is None:
        return
    if not isinstance(inner, torch.optim.Optimizer):
        raise UnsupportedSetupError(
            f"{type(optimizer).__name__}.optimizer is a {type(inner).__name__}, not a "
            "torch.optim.Optimizer; scout-megatron cannot hook it"
        )
    out.append((inner, optimizer))


def inner_optimizers(optimizer: Any) -> list[InnerOptimizer]:
    """Every torch optimizer a Megatron (or torch) optimizer drives; none for stubs.

    Raises :class:`~scout_core.UnsupportedSetupError` for an optimizer whose
    ``.optimizer`` is not a torch optimizer.
    """
    found: list[tuple[torch.optim.Optimizer, Any]] = []
    _walk(optimizer, found)
    out = []
    for index, (inner, wrapper) in enumerate(found):
        names = [c.__name__ for c in type(wrapper).__mro__] if wrapper is not None else []
        out.append(
            InnerOptimizer(
                optimizer=inner,
                wrapper=type(wrapper).__name__ if wrapper is not None else "",
                index=index,
                sharded="DistributedOptimizer" in names,
            )
        )
    return out


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """Just the torch optimizers of :func:`inner_optimizers`, in order."""
    return [inner.optimizer for inner in inner_optimizers(optimizer)]
