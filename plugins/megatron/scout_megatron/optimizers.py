"""The torch optimizers inside a Megatron optimizer, and what each of them sees.

Contract: :func:`inner_optimizers` returns the ``torch.optim.Optimizer`` s a ``MegatronOptimizer``
drives (``.optimizer`` of ``FP32Optimizer``, ``Float16OptimizerWithFloat16Params`` and
``DistributedOptimizer``; each member of a ``ChainedOptimizer``; none for a stub), each marked
:attr:`InnerOptimizer.sharded` when it steps on this rank's ``DistributedOptimizer`` shard,
which no replica peer holds. What replay covers per kind: docs/megatron.md, "Optimizers".
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
    """True under ``DistributedOptimizer``: param groups hold this rank's fp32 shards."""


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
    ``UnsupportedSetupError`` when an ``.optimizer`` is not a torch optimizer."""
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
