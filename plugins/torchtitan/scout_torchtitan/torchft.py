"""SCOUT on TorchFT jobs: TorchFT's checkpoint manager with :class:`ScoutManagerMixin`.

The override factory maps ``TorchFTCheckpointManager``'s config here, FT settings kept; a live
TorchFT manager is refused when SCOUT attaches (docs/torchtitan.md, "Checkpoint gating").
Importing this module needs no ``torchft``; building the manager does. Only the config mapping
is tested: the manager has not run (no ``torchft`` on the development machine).
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
