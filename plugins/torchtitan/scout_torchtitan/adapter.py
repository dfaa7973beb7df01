"""The TorchTitan adapter: a ``Trainer``'s facts in the shape of the core's adapter protocol.

Contract: :class:`TitanAdapter` is the core's ``TorchAdapter`` (TorchTitan uses DTensors) plus
the layout from ``ParallelDims`` (:mod:`.layout`), each part's modules and inner optimizers, a
twin without the redistributing ``forward`` closures (:mod:`.replay`) and every enabled 1-D mesh
as a training group; expert parallelism is refused. docs/torchtitan.md, "What attaches where".
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
