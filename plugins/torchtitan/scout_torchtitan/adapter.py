"""The TorchTitan adapter: a ``Trainer``'s facts in the shape of the core's adapter protocol.

TorchTitan 0.3 parallelises with DTensors (FSDP2 on every parameter, TP and SP as
sharded parameters, buffers and activations), so the adapter builds on the core's
plain-PyTorch :class:`~scout_core.plugin_api.TorchAdapter`, which gathers DTensor
parameters, buffers and activations on SCOUT's own groups. What TorchTitan adds:

* **layout** from ``ParallelDims`` (:func:`~scout_torchtitan.layout.titan_layout`,
  checked against every mesh TorchTitan built): replicas over ``dp_replicate``, TP /
  PP / CP coordinates;
* **modules** of every model part (:func:`~scout_torchtitan.modules.titan_modules`):
  the ``layers`` ModuleDict seen through activation-checkpoint wrappers, the first
  stage's embedding, the last stage's LM head;
* **optimizers**: the inner optimizer of every model part (and optimizer name); the
  ``OptimizersContainer`` steps each once per iteration, so the core's step clock
  makes one boundary of them and optimizer replay rotates its slice over all
  (:mod:`scout_torchtitan.optimizers`);
* **the twin**: TorchTitan replaces each parallelised module's instance ``forward``
  with a redistributing closure; the replay twin drops those
  (:func:`~scout_torchtitan.replay.detach_titan_parallelism`) so it computes the
  plain function of the full tensors it is given, with no collective;
* **training groups**: every enabled one-dimensional mesh, by TorchTitan's name.

RNG streams are the core's defaults: ``set_determinism`` seeds the CPU generator and
DTensor's tracker draws from the device generator (no state of its own).

[What is refused]
Expert parallelism (``ep > 1``): the expert replicas (``dp_replicate`` x ``efsdp``)
overlap the dense axes, which the core's ``MeshLayout`` cannot express, and a
replayed MoE block would dispatch tokens over the training EP group. The refusal
names both; dense layouts (DDP, TP, FSDP, PP, CP) are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from scout_core import Config, UnsupportedSetupError
from scout_core.plugin_api import TorchAdapter
from scout_torchtitan.layout import TitanLayout, titan_layout
from scout_torchtitan.modules import titan_modules
from scout_torchtitan.optimizers import TitanOptimizers, titan_optimizers
from scout_torchtitan.replay import detach_titan_parallelism

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["TitanAdapter", "require_trainer"]


def require_trainer(obj: object) -> None:
    """Raise :class:`UnsupportedSetupError` unless ``obj`` looks like TorchTitan's Trainer."""
    missing = [a for a in ("parallel_dims", "model_parts", "optimizers") if not hasattr(obj, a)]
    if missing:
        raise UnsupportedSetupError(
            "scout-torchtitan attaches to a TorchTitan Trainer (it reads parallel_dims, "
            f"model_parts and optimizers); {type(obj).__module__}.{type(obj).__qualname__} "
            f"has no {', '.join(missing)}. Switch SCOUT on with --override.imports "
            "'scout_torchtitan.overrides.scout={...}' or scout.enable(trainer)"
        )


class TitanAdapter(TorchAdapter):
    """:class:`~scout_core.plugin_api.FrameworkAdapter` for a TorchTitan ``Trainer``."""

    name = "torchtitan"

    def __init__(self, trainer: Any, config: Config) -> None:
        require_trainer(trainer)
        pd = trainer.parallel_dims
        if int(pd.ep) > 1:
            raise UnsupportedSetupError(
                f"expert parallelism (ep={pd.ep}) is not supported by scout-torchtitan: the "
                "expert replicas (dp_replicate x efsdp) overlap the dense mesh axes, which "
                "SCOUT's MeshLayout cannot express, and a replayed MoE block would dispatch "
                "tokens over the training EP group"
            )
        self.trainer = trainer
        self.titan: TitanLayout = titan_layout(pd)
        parts: list[nn.Module] = list(trainer.model_parts)
        self.titan_optimizers: TitanOptimizers = titan_optimizers(trainer.optimizers, parts)
        super().__init__(
            parts[0],
            [p.optimizer for p in self.titan_optimizers.per_part],
            titan_modules(parts, config),
            mesh=self.titan.layout,
        )
        self.model_parts = parts

    def training_groups(self) -> Mapping[str, ProcessGroup]:
        """TorchTitan's one-dimensional meshes' groups, by mesh name (never used for traffic)."""
        meshes = self.trainer.parallel_dims.get_all_one_dimensional_meshes()
        return {str(name): mesh.get_group() for name, mesh in sorted(meshes.items())}

    def twin(self, module: nn.Module) -> nn.Module:
        """The core's hook-free twin without TorchTitan's redistributing forwards."""
        return detach_titan_parallelism(super().twin(module))
