"""SCOUT on TorchFT jobs: TorchFT's checkpoint manager with :class:`ScoutManagerMixin`.

TorchTitan's TorchFT integration (``torchtitan.experiments.torchft``) replaces the
checkpoint manager with ``TorchFTCheckpointManager``, a ``CheckpointManager``
subclass that saves per-replica dataloader state and hands state-dict callbacks to
the TorchFT manager (its ``__init__`` takes an extra ``ft_manager``). The override
factory maps its config here so a fault-tolerant job keeps that behaviour and gains
SCOUT's. Importing this module needs no ``torchft`` package; building the manager
does (``FaultTolerantTrainer`` does both).

Phase 1 status: the config mapping is tested; the manager itself has not run,
because ``torchft`` is not installed on the development machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager

from scout_core import Config as ScoutConfig
from scout_torchtitan.manager import ScoutManagerMixin

__all__ = ["ScoutTorchFTCheckpointManager"]


class ScoutTorchFTCheckpointManager(ScoutManagerMixin, TorchFTCheckpointManager):  # type: ignore[misc]  # untyped base
    """TorchFT's checkpoint manager with SCOUT riding along."""

    @dataclass(kw_only=True, slots=True)
    class Config(TorchFTCheckpointManager.Config):  # type: ignore[misc]  # untyped base
        scout: ScoutConfig | None = None
        """SCOUT's settings (``scout_core.Config``), validated by the override factory."""
