"""TorchTitan's optimizers as SCOUT sees them: one container, one optimizer per model part.

Contract: :func:`titan_optimizers` lists each model part's inner optimizer, which optimizer replay
re-runs and the step clock hooks; :func:`materialize_state_quietly` creates their state before a
load without counting a step. docs/torchtitan.md, "Checkpoint gating".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["PartOptimizer", "TitanOptimizers", "materialize_state_quietly", "titan_optimizers"]


@dataclass(frozen=True)
class PartOptimizer:
    """One inner optimizer and the model part whose parameters it updates."""

    part: int
    optimizer: torch.optim.Optimizer


@dataclass(frozen=True)
class TitanOptimizers:
    """The container to hook for step boundaries and the inner optimizers to replay."""

    container: torch.optim.Optimizer
    per_part: tuple[PartOptimizer, ...]


def titan_optimizers(container: Any, model_parts: Sequence[nn.Module]) -> TitanOptimizers:
    """Split ``trainer.optimizers`` into the hookable container and its inner optimizers.
    ``TypeError`` when the container is not a ``torch.optim.Optimizer`` (TorchTitan < 0.3, or a
    container that skipped ``_post_init``); ``ValueError`` when an inner one spans model parts."""
    if not isinstance(container, torch.optim.Optimizer):
        raise TypeError(
            f"trainer.optimizers is a {type(container).__name__}, not a torch.optim.Optimizer: "
            "SCOUT cannot hook its step"
        )
    inner = list(getattr(container, "optimizers", ()))
    if not inner:
        raise TypeError(f"{type(container).__name__} has no inner optimizers ('optimizers')")
    owner = {id(p): i for i, part in enumerate(model_parts) for p in part.parameters()}
    out: list[PartOptimizer] = []
    for opt in inner:
        parts = {owner.get(id(p), -1) for group in opt.param_groups for p in group["params"]}
        if len(parts) != 1 or -1 in parts:
            raise ValueError(
                f"inner optimizer {type(opt).__name__} updates parameters of model parts "
                f"{sorted(parts)}; expected exactly one part"
            )
        out.append(PartOptimizer(parts.pop(), opt))
    return TitanOptimizers(container, tuple(out))


def materialize_state_quietly(container: Any) -> int:
    """Create the state of every inner optimizer that has none, as TorchTitan's
    checkpoint load would, without firing step hooks; returns how many it created."""
    from torchtitan.components.optimizer.utils import init_optim_state

    made = 0
    for opt in getattr(container, "optimizers", ()):
        if opt.state:
            continue
        pre, post = opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks
        opt._optimizer_step_pre_hooks = OrderedDict()
        opt._optimizer_step_post_hooks = OrderedDict()
        try:
            init_optim_state(opt)
        finally:
            opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks = pre, post
        made += bool(opt.state)
    return made
