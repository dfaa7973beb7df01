"""``ScoutCheckpointManager``: TorchTitan's checkpoint manager, built with the Trainer in hand.

[Why the checkpoint manager is the seam]
TorchTitan 0.3 builds every component from its config inside ``Trainer.__init__``
and offers one way to swap a component without editing the job's config function:
``--override.imports`` (see :mod:`scout_torchtitan.overrides`). Of all components,
only the checkpoint manager is built with the whole trainer: the Trainer passes
``states={"train_state": self}``, and by then the trainer has ``parallel_dims``
(meshes built), ``model_parts`` (parallelized, initialised), ``optimizers``,
``lr_schedulers``, ``dataloader`` and ``step``. Every save and load of the job also
goes through this object (``Trainer.train`` calls ``save`` every step and ``load``
once at start), which is where SCOUT's checkpoint gate belongs.

Phase 1 (this file): the manager is TorchTitan's own ``CheckpointManager`` (or the
TorchFT subclass, :mod:`scout_torchtitan.torchft`) plus :class:`ScoutManagerMixin`,
which validates the SCOUT settings, reads the trainer and records what it saw
(:class:`ScoutSeen`, logged and kept on ``manager.scout_seen``). Phase 2 attaches a
SCOUT session there and routes ``_save`` / ``_load`` through the core's gate.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from torchtitan.components.checkpoint import CheckpointManager

from scout_core import Config as ScoutConfig
from scout_torchtitan.layout import titan_layout
from scout_torchtitan.modules import find_titan_modules
from scout_torchtitan.optimizers import titan_optimizers

__all__ = ["ScoutCheckpointManager", "ScoutManagerMixin", "ScoutSeen", "built"]

log = logging.getLogger(__name__)

_BUILT: list[ScoutSeen] = []


@dataclass(frozen=True)
class ScoutSeen:
    """What the manager found on the Trainer when TorchTitan built it (JSON-able)."""

    manager: str
    """Class of the manager that was built (its ``__qualname__``)."""
    trainer: str
    step: int
    rank: int
    world_size: int
    parallel_dims: dict[str, Any]
    layout_sizes: dict[str, int]
    dense_replicas: list[int]
    expert_replicas: list[int] | None
    coordinates: dict[str, int]
    model_parts: int
    layers: list[str]
    embedding: str | None
    lm_head: str | None
    optimizer: str
    part_optimizers: list[list[Any]]
    checkpoint_enabled: bool
    checkpoint_folder: str | None
    scout: dict[str, Any] = field(default_factory=dict)


def _seen(manager: Any, trainer: Any, scout: ScoutConfig) -> ScoutSeen:
    pd = trainer.parallel_dims
    tl = titan_layout(pd)
    mods = find_titan_modules(trainer.model_parts)
    opts = titan_optimizers(trainer.optimizers, trainer.model_parts)
    names = ("d", "s", "t", "p", "c", "e")
    return ScoutSeen(
        manager=type(manager).__qualname__,
        trainer=type(trainer).__qualname__,
        step=int(trainer.step),
        rank=tl.rank,
        world_size=int(pd.world_size),
        parallel_dims={
            k: getattr(pd, k)
            for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "spmd_backend")
        },
        layout_sizes=dict(zip(names, tl.layout.sizes, strict=True)),
        dense_replicas=list(tl.dense_replicas),
        expert_replicas=None if tl.expert_replicas is None else list(tl.expert_replicas),
        coordinates=tl.coordinates,
        model_parts=len(trainer.model_parts),
        layers=[layer.path for layer in mods.layers],
        embedding=None if mods.embedding is None else mods.embedding.path,
        lm_head=None if mods.lm_head is None else mods.lm_head.path,
        optimizer=type(opts.container).__qualname__,
        part_optimizers=[[p.part, type(p.optimizer).__qualname__] for p in opts.per_part],
        checkpoint_enabled=bool(manager.enable),
        checkpoint_folder=getattr(manager, "folder", None),
        scout=scout.to_dict(),
    )


class ScoutManagerMixin:
    """Put before a TorchTitan checkpoint manager class in the bases.

    The subclass's ``Config`` must carry ``scout: scout_core.Config | None`` (the
    settings the override factory validated). ``__init__`` takes the trainer out of
    ``states`` *before* the base class adds its own entries, runs the base
    ``__init__`` unchanged, then records :class:`ScoutSeen`.
    """

    scout_config: ScoutConfig
    scout_seen: ScoutSeen

    def __init__(self, config: Any, **kwargs: Any) -> None:
        trainer = kwargs.get("states", {}).get("train_state")
        super().__init__(config, **kwargs)  # type: ignore[call-arg]  # next in MRO: the manager
        if trainer is None or not hasattr(trainer, "parallel_dims"):
            raise TypeError(
                f"{type(self).__name__} must be built by a TorchTitan Trainer, which passes "
                "states={'train_state': trainer}; got no trainer"
            )
        self.scout_config = config.scout if config.scout is not None else ScoutConfig()
        self.scout_seen = _seen(self, trainer, self.scout_config)
        _BUILT.append(self.scout_seen)
        log.info(
            "SCOUT checkpoint manager built on rank %d: %d layers, layout %s, settings %s",
            self.scout_seen.rank,
            len(self.scout_seen.layers),
            self.scout_seen.layout_sizes,
            {k: v for k, v in self.scout_seen.scout.items() if k in ("enabled", "replay_interval")},
        )


class ScoutCheckpointManager(ScoutManagerMixin, CheckpointManager):  # type: ignore[misc]  # untyped base
    """TorchTitan's DCP ``CheckpointManager`` with SCOUT riding along (see module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]  # untyped base
        scout: ScoutConfig | None = None
        """SCOUT's settings (``scout_core.Config``), validated by the override factory."""


def built() -> list[dict[str, Any]]:
    """Every :class:`ScoutSeen` recorded in this process, oldest first, as dicts."""
    return [asdict(s) for s in _BUILT]
