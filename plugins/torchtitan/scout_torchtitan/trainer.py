"""``ScoutTrainer``: TorchTitan's ``Trainer`` with a ``scout`` config section (``--scout.*``).

Contract: ``ScoutTrainer.Config.scout`` is :class:`scout_core.Config` (a flag per field, checked at
parse time), off by default; ``--scout.enabled`` swaps in SCOUT's checkpoint-manager config before
``Trainer.__init__`` builds anything, as the override does. :func:`with_scout` converts a stock
``Trainer.Config`` (TorchFT: use the override). docs/torchtitan.md, "Switching it on".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchtitan.config.override import derive
from torchtitan.trainer import Trainer

from scout_core import Config as ScoutConfig
from scout_core import UnsupportedSetupError
from scout_torchtitan.overrides import scout_checkpoint_config
from scout_torchtitan.versions import check_version

__all__ = ["ScoutTrainer", "with_scout"]


def _disabled() -> ScoutConfig:
    return ScoutConfig(enabled=False)


class ScoutTrainer(Trainer):  # type: ignore[misc]  # untyped base
    """TorchTitan's ``Trainer`` whose config has a ``scout`` section."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):  # type: ignore[misc]  # untyped base
        scout: ScoutConfig = field(default_factory=_disabled)
        """SCOUT's settings (``--scout.<key>``); SCOUT attaches only with ``--scout.enabled``."""

    def __init__(self, config: Config) -> None:
        if config.scout.enabled:
            check_version()
            config.checkpoint = scout_checkpoint_config(config.checkpoint, config.scout)
        super().__init__(config)


def with_scout(config: Any, **settings: Any) -> ScoutTrainer.Config:
    """``config`` (a stock ``Trainer.Config``) as a ``ScoutTrainer.Config`` with SCOUT ``settings``
    (``enabled`` defaults to False). Subclassed configs (TorchFT's ...) are refused: copying them
    would drop their own sections."""
    if type(config) is not Trainer.Config:
        raise UnsupportedSetupError(
            f"with_scout() takes TorchTitan's Trainer.Config, got {type(config).__qualname__}; "
            "switch SCOUT on for that trainer with --override.imports "
            "scout_torchtitan.overrides.scout instead"
        )
    scout = ScoutConfig.from_mapping(
        {"enabled": False, **settings}, source="with_scout(...) SCOUT settings"
    )
    result: ScoutTrainer.Config = derive(config, ScoutTrainer.Config, scout=scout)
    return result
