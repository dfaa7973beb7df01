"""DeepSpeed MoE layers as the core's ``router:<i>`` / ``experts:<i>`` parts.

Contract: :func:`moe_parts` maps every ``MOELayer`` (the ``deepspeed_moe`` child of ``MoE``)
to ``router:<i>`` (its ``TopKGate``, path ``<layer>.gate``) and ``experts:<i>`` (its
``Experts.deepspeed_experts``, reported as ``<layer>.experts``), ``<layer>`` being the
catalog's name for the ``MOELayer``; a layer of another shape is logged and skipped. Docs:
docs/deepspeed.md, "Ulysses sequence parallel and MoE expert parallel".
"""

from __future__ import annotations

import logging

from torch import nn

from scout_core.plugin_api import ModuleRef

__all__ = ["moe_parts"]

log = logging.getLogger(__name__)


def _moe_layer_class() -> type[nn.Module] | None:
    try:
        from deepspeed.moe.sharded_moe import MOELayer
    except ImportError:  # pragma: no cover - DeepSpeed without MoE
        return None
    cls: type[nn.Module] = MOELayer
    return cls


def moe_parts(root: nn.Module) -> tuple[tuple[ModuleRef, ...], tuple[ModuleRef, ...]]:
    """Routers and local-expert lists of each ``MOELayer`` under ``root``, in model order."""
    cls = _moe_layer_class()
    if cls is None:
        return (), ()
    routers: list[ModuleRef] = []
    experts: list[ModuleRef] = []
    for path, module in root.named_modules():
        if not isinstance(module, cls):
            continue
        gate = getattr(module, "gate", None)
        local = getattr(getattr(module, "experts", None), "deepspeed_experts", None)
        if not isinstance(gate, nn.Module) or not isinstance(local, nn.ModuleList) or not local:
            log.warning(
                "DeepSpeed MoE layer %s has no gate module or no 'experts.deepspeed_experts' "
                "list of local experts (found %s, %s): its router and experts are not replayed",
                path,
                type(gate).__name__,
                type(local).__name__,
            )
            continue
        routers.append(ModuleRef(f"{path}.gate", gate))
        experts.append(ModuleRef(f"{path}.experts", local))
    return tuple(routers), tuple(experts)
