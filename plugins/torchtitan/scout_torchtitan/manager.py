"""``ScoutCheckpointManager``: TorchTitan's checkpoint manager, built with the Trainer in hand.

Contract: :class:`ScoutManagerMixin`, once the base manager is built, enables SCOUT with the
override's settings, routes ``_save`` / ``_load`` through the gate (:mod:`.gating`), closes the
session on ``close`` and records a :class:`ScoutSeen` (:func:`built`); no ``--checkpoint.enable``
needed. docs/torchtitan.md, "What attaches where".
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager

from scout_core import Config as ScoutConfig
from scout_core import UnsupportedSetupError
from scout_core.plugin_api import FrameworkGate, Session
from scout_torchtitan.gating import gated_load, gated_save

__all__ = ["ScoutCheckpointManager", "ScoutManagerMixin", "ScoutSeen", "built"]

log = logging.getLogger(__name__)

_BUILT: list[ScoutSeen] = []


@dataclass(frozen=True)
class ScoutSeen:
    """What SCOUT attached when TorchTitan built its checkpoint manager (JSON-able)."""

    manager: str
    trainer: str
    step: int
    rank: int
    world_size: int
    enabled: bool
    """Whether SCOUT attached (False: the settings say ``enabled: false``)."""
    parallel_dims: dict[str, Any]
    layout_sizes: dict[str, int] = field(default_factory=dict)
    peers: list[int] = field(default_factory=list)
    """This rank's replay comparison group (the dense replicas with its local shards)."""
    dense_replicas: list[int] = field(default_factory=list)
    coordinates: dict[str, int] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    embedding: str | None = None
    lm_head: str | None = None
    optimizers: list[str] = field(default_factory=list)
    checkpoint_enabled: bool = False
    gated: bool = False
    scout: dict[str, Any] = field(default_factory=dict)


def _seen(manager: Any, trainer: Any, session: Session) -> ScoutSeen:
    pd = trainer.parallel_dims
    dims = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "spmd_backend")
    base: dict[str, Any] = {
        "manager": type(manager).__qualname__,
        "trainer": type(trainer).__qualname__,
        "step": int(trainer.step),
        "rank": int(dist.get_rank()) if dist.is_initialized() else 0,
        "world_size": int(pd.world_size),
        "enabled": session.enabled,
        "parallel_dims": {k: getattr(pd, k) for k in dims},
        "checkpoint_enabled": bool(manager.enable),
        "gated": isinstance(session.checkpoints, FrameworkGate) and bool(manager.enable),
        "scout": session.config.to_dict(),
    }
    from scout_torchtitan.plugin import plugin

    adapter, peers = plugin.adapter_of(trainer), session.peers
    if adapter is None or peers is None:
        return ScoutSeen(**base)
    from scout_torchtitan.adapter import TitanAdapter

    assert isinstance(adapter, TitanAdapter)
    layout, special = adapter.titan.layout, adapter.special_modules()
    names = ("d", "s", "t", "p", "c", "e")
    return ScoutSeen(
        **base,
        layout_sizes=dict(zip(names, layout.sizes, strict=True)),
        peers=list(peers.ranks),
        dense_replicas=list(adapter.titan.dense_replicas),
        coordinates=adapter.titan.coordinates,
        layers=[ref.path for ref in adapter.repeated_layers()],
        embedding=special["embedding"].path if "embedding" in special else None,
        lm_head=special["lm_head"].path if "lm_head" in special else None,
        optimizers=[type(o).__qualname__ for o in adapter.optimizers()],
    )


class ScoutManagerMixin:
    """Put before a TorchTitan checkpoint manager class in the bases; the subclass's ``Config``
    carries ``scout: scout_core.Config | None``. ``__init__`` takes the trainer out of ``states``
    *before* the base adds its own entries, runs the base ``__init__`` unchanged, then enables
    SCOUT (collective: every rank builds its manager at the same point of ``Trainer.__init__``)."""

    scout_config: ScoutConfig
    scout_session: Session
    scout_seen: ScoutSeen
    scout_gate: FrameworkGate | None = None
    """The checkpoint gate while one is wired (set by the plugin's ``wire_checkpoints``)."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        trainer = kwargs.get("states", {}).get("train_state")
        super().__init__(config, **kwargs)  # type: ignore[call-arg]  # next in MRO: the manager
        if trainer is None or not hasattr(trainer, "parallel_dims"):
            raise TypeError(
                f"{type(self).__name__} must be built by a TorchTitan Trainer, which passes "
                "states={'train_state': trainer}; got no trainer"
            )
        if getattr(self, "ft_manager", None) is not None:
            raise UnsupportedSetupError(
                "SCOUT does not watch TorchFT fault-tolerant replicas: each TorchFT replica "
                "group is its own torch.distributed job, so SCOUT's replica comparison and "
                "its checkpoint gate would see one replica only. Run SCOUT without TorchFT, "
                "or TorchFT without SCOUT"
            )
        from scout_torchtitan.plugin import plugin

        self.scout_config = config.scout if config.scout is not None else ScoutConfig()
        self.scout_session = plugin.enable(trainer, config=self.scout_config, manager=self)
        self.scout_seen = _seen(self, trainer, self.scout_session)
        _BUILT.append(self.scout_seen)
        log.info(
            "SCOUT %s on rank %d: %d layers, layout %s, peers %s, checkpoint gate %s",
            "attached" if self.scout_seen.enabled else "disabled",
            self.scout_seen.rank,
            len(self.scout_seen.layers),
            self.scout_seen.layout_sizes,
            self.scout_seen.peers,
            "on" if self.scout_seen.gated else "off",
        )

    # TorchTitan's hooks for subclasses (the public save/load check ``enable`` first).

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        if self.scout_gate is None:
            return bool(self.scout_raw_save(curr_step, last_step))
        return gated_save(self, self.scout_gate, curr_step, last_step, self.scout_raw_save)

    def _load(self, step: int = -1) -> bool:
        if self.scout_gate is None:
            return bool(self.scout_raw_load(step))
        return gated_load(self, self.scout_gate, step, self.scout_raw_load)

    def scout_raw_save(self, curr_step: int, last_step: bool = False) -> bool:
        """The base manager's own ``_save`` (no gate)."""
        return bool(super()._save(curr_step, last_step))  # type: ignore[misc]  # the manager's

    def scout_raw_load(self, step: int = -1) -> bool:
        """The base manager's own ``_load`` (no gate)."""
        return bool(super()._load(step))  # type: ignore[misc]  # the manager's

    def close(self) -> None:
        """TorchTitan's ``close`` (only acts when checkpointing is on), then SCOUT's session."""
        super().close()  # type: ignore[misc]  # the manager's
        session = getattr(self, "scout_session", None)
        if session is not None:
            session.close()


class ScoutCheckpointManager(ScoutManagerMixin, CheckpointManager):  # type: ignore[misc]  # untyped base
    """TorchTitan's DCP ``CheckpointManager`` with SCOUT riding along (see module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]  # untyped base
        scout: ScoutConfig | None = None
        """SCOUT's settings (``scout_core.Config``), validated by the override factory."""


def built() -> list[dict[str, Any]]:
    """Every :class:`ScoutSeen` recorded in this process, oldest first, as dicts."""
    return [asdict(s) for s in _BUILT]
