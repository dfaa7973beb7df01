"""megatron-core ``MoELayer`` s as the core's ``router:<i>`` / ``experts:<i>`` parts.

The core replays an MoE layer in two recipes (``docs/moe.md``): its **router** is
captured and replayed like a layer, and its **local experts** run at the shape
catalog's representatives on synthetic inputs drawn from a broadcast seed, on every
expert-data-parallel peer. Megatron's ``MoELayer`` (``megatron.core.transformer.moe``,
the ``mlp`` of an MoE ``TransformerLayer``) has the parts, but not in the shape the
core's discovery looks for, so this module maps them:

* ``MoELayer.router`` (``TopKRouter``): ``router:<i>``, path
  ``decoder.layers.<j>.mlp.router``. Its forward returns ``(probs, routing_map)``: the
  router round compares the routing weights and the boolean routing map apart;
* ``MoELayer.experts`` as a ``SequentialMLP``: its ``local_experts`` ``ModuleList``
  of ``MLP`` s is ``experts:<i>``, reported under ``decoder.layers.<j>.mlp.experts``.
  So the catalog names the layer ``decoder.layers.<j>.mlp`` (projections ``.up`` /
  ``.down`` in ``scout catalog discover --model``);
* ``GroupedMLP`` / ``TEGroupedMLP`` run every local expert in one grouped GEMM and
  hold no module per expert, so there is no expert to run on its own: such a layer's
  experts are **not replayed** (logged once per layer, with the class), while its
  router is.

Two Megatron conventions differ from what the core expects of a part, and
:func:`call_part` bridges them inside the adapter's ``call``:

* an expert ``MLP`` returns ``(output, output_bias)``; the expert recipe wants one
  tensor: the output, plus the bias when Megatron returns one apart;
* a router forward with an auxiliary or z-loss adds that loss into Megatron's MoE
  logging tracker (``get_moe_layer_wise_logging_tracker``), which training logs and
  then clears. A replayed router must not count there: the tracker's values are
  restored after the replayed forward.
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
    """Megatron's MoE aux-loss tracker entries by name, and how to read an entry's values:
    ``get_moe_metrics_tracker().metrics`` (``moe_logging``, 0.17 and later), else the
    0.16 dict of ``moe_utils.get_moe_layer_wise_logging_tracker()`` (deprecated later)."""
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
