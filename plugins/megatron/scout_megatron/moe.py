"""megatron-core ``MoELayer`` s as the core's ``router:<i>`` / ``experts:<i>`` parts.

Contract: :func:`moe_parts` maps each ``MoELayer``'s ``TopKRouter`` to ``router:<i>``
(``...mlp.router``) and a ``SequentialMLP``'s ``local_experts`` to ``experts:<i>``
(``...mlp.experts``); grouped-GEMM experts have no module per expert and are not replayed (logged
once per layer). :func:`call_part` returns an expert's output (plus its bias when returned
apart) and restores Megatron's MoE loss tracker after a replayed router. Docs: docs/megatron.md,
"MoE layers".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from scout_core.plugin_api import ModuleRef

__all__ = ["MoeParts", "call_part", "moe_parts"]

log = logging.getLogger(__name__)


class MoeParts:
    """The routers and expert lists of a model's MoE layers, in model order."""

    def __init__(self, routers: Sequence[ModuleRef], experts: Sequence[ModuleRef]) -> None:
        self.routers = tuple(routers)
        self.experts = tuple(experts)
        self.router_ids = {id(r.module) for r in self.routers}
        self.expert_ids = {id(e) for ref in self.experts for e in ref.module.children()}


def _moe_layer_class() -> type[nn.Module] | None:
    try:
        from megatron.core.transformer.moe.moe_layer import MoELayer
    except ImportError:  # pragma: no cover - megatron-core without MoE
        return None
    cls: type[nn.Module] = MoELayer
    return cls


def moe_parts(layers: Sequence[ModuleRef]) -> MoeParts:
    """The MoE parts inside the repeated ``layers`` (paths below each layer's path)."""
    cls = _moe_layer_class()
    routers: list[ModuleRef] = []
    experts: list[ModuleRef] = []
    if cls is None:
        return MoeParts(routers, experts)
    for ref in layers:
        for name, module in ref.module.named_modules():
            if not isinstance(module, cls):
                continue
            path = f"{ref.path}.{name}" if name else ref.path
            router = getattr(module, "router", None)
            if isinstance(router, nn.Module):
                routers.append(ModuleRef(f"{path}.router", router))
            local = getattr(getattr(module, "experts", None), "local_experts", None)
            if isinstance(local, nn.ModuleList) and len(local) > 0:
                experts.append(ModuleRef(f"{path}.experts", local))
            else:
                log.warning(
                    "the experts of MoE layer %s are not replayed: %s runs its local experts "
                    "in one grouped GEMM and has no module per expert (expert replay needs "
                    "SequentialMLP, moe_grouped_gemm=False); its router is replayed",
                    path,
                    type(getattr(module, "experts", None)).__name__,
                )
    return MoeParts(routers, experts)


def _loss_entries() -> tuple[MutableMapping[str, Any], Callable[[Any], torch.Tensor]]:
    """Megatron's MoE aux-loss tracker entries by name, and a reader of an entry's values:
    ``moe_logging``'s (0.17+), else 0.16's ``moe_utils`` dict (deprecated later)."""
    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    except ImportError:
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        return get_moe_layer_wise_logging_tracker(), lambda entry: entry["values"]
    return get_moe_metrics_tracker().metrics, lambda entry: entry.values


@contextmanager
def _aux_losses_kept() -> Iterator[None]:
    """Restore Megatron's MoE logging tracker (aux / z-loss values) on exit."""
    tracker, values_of = _loss_entries()
    saved = {name: values_of(entry).clone() for name, entry in tracker.items()}
    try:
        yield
    finally:
        for name in [n for n in tracker if n not in saved]:
            del tracker[name]
        for name, values in saved.items():
            values_of(tracker[name]).copy_(values)


def call_part(parts: MoeParts, module: nn.Module, run: Callable[[], Any]) -> Any:
    """``run()`` (the replayed call of ``module``), adapted when ``module`` is an MoE part."""
    if id(module) in parts.router_ids:
        with _aux_losses_kept():
            return run()
    out = run()
    if id(module) in parts.expert_ids and isinstance(out, tuple):
        output, bias = out
        result: torch.Tensor = output if bias is None else output + bias
        return result
    return out
