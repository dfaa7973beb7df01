"""SCOUT on TorchFT jobs: TorchFT's checkpoint manager with :class:`ScoutManagerMixin`.

TorchTitan's TorchFT integration swaps in ``TorchFTCheckpointManager``, which saves per-replica
dataloader state and hands state-dict callbacks to the TorchFT manager (``__init__`` takes
``ft_manager``). The override factory maps its config here, so a fault-tolerant job keeps that and
gains SCOUT. Importing this module needs no ``torchft``; building the manager does.

Phase 1 status: the config mapping is tested; the manager has not run (no ``torchft`` on the
development machine).
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
