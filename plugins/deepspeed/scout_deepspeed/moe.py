"""DeepSpeed MoE layers as the core's ``router:<i>`` / ``experts:<i>`` parts.

The core replays an MoE layer in two recipes (``docs/moe.md``): the **router** is
captured and replayed like a layer (its input has a fixed shape), and the layer's
**local experts** are replayed at the shape catalog's representatives on synthetic
inputs drawn from a broadcast seed, on every expert-data-parallel peer. The core's
own discovery finds a layer with an ``experts`` ``ModuleList`` beside a ``router`` or
``gate``; DeepSpeed's layout is one level deeper, so this module maps it:

* ``deepspeed.moe.layer.MoE`` (the user's module) holds ``deepspeed_moe``, a
  ``MOELayer`` (``deepspeed.moe.sharded_moe``): the MoE layer proper;
* ``MOELayer.gate`` is the ``TopKGate`` (its linear ``wg`` scores the experts):
  ``router:<i>``, path ``<layer>.gate``. Its forward returns ``(l_aux,
  combine_weights, dispatch_mask, exp_counts)``: the router round compares the
  floating leaves (routing weights) and the integer and boolean ones (dispatch) apart;
* ``MOELayer.experts`` is an ``Experts`` whose ``deepspeed_experts`` ``ModuleList``
  holds this rank's local experts (deep copies of the user's expert module, each
  mapping ``(rows, d_model)`` to ``(rows, d_model)``): ``experts:<i>``, reported
  under the ``Experts`` module's path ``<layer>.experts``.

So the catalog names a DeepSpeed MoE layer by the ``MOELayer``'s path: for
``layers.0.moe = MoE(...)`` the layer is ``layers.0.moe.deepspeed_moe`` and its
projections ``layers.0.moe.deepspeed_moe.up`` / ``.down`` (``scout catalog discover
--model``). A layer whose gate or experts do not have this shape is not replayed by
these recipes (logged, with the reason).
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
    """The routers and local-expert lists of every DeepSpeed ``MOELayer`` under ``root``,
    in model order (paths relative to ``root``)."""
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
