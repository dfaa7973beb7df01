"""The switch: ``--override.imports 'scout_torchtitan.overrides.scout={"replay_interval": 20}'``.

Contract: :func:`scout`, an ``@override`` factory registered for every checkpoint-manager config
(``BaseCheckpointManager.Config`` and subclasses: ``exact=True`` would skip subclasses silently),
validates the settings with ``Config.from_mapping`` and replaces the config by class before
anything is built: TorchTitan's → SCOUT's, TorchFT's → SCOUT's TorchFT subclass, SCOUT's → the
new settings, any other → ``UnsupportedSetupError``. docs/torchtitan.md, "Switching it on".
"""

from __future__ import annotations

from typing import Any

from torchtitan.components.checkpointer import BaseCheckpointManager, CheckpointManager
from torchtitan.config.override import derive, override

from scout_core import Config, UnsupportedSetupError
from scout_torchtitan.manager import ScoutCheckpointManager
from scout_torchtitan.plugin import SECTION
from scout_torchtitan.versions import check_version

__all__ = ["SECTION", "scout", "scout_checkpoint_config"]


_TORCHFT = "torchtitan.experiments.torchft.checkpoint"


def scout_checkpoint_config(cfg: Any, settings: Config) -> Any:
    """The SCOUT checkpoint-manager config replacing ``cfg`` (see the module docstring)."""
    cls = type(cfg)
    if cls.__module__.startswith("scout_torchtitan.") and hasattr(cfg, "scout"):
        return derive(cfg, cls, scout=settings)  # already SCOUT's: new settings only
    if cls is CheckpointManager.Config:
        return derive(cfg, ScoutCheckpointManager.Config, scout=settings)
    if cls.__module__ == _TORCHFT and cls.__qualname__ == "TorchFTCheckpointManager.Config":
        from scout_torchtitan.torchft import ScoutTorchFTCheckpointManager

        return derive(cfg, ScoutTorchFTCheckpointManager.Config, scout=settings)
    raise UnsupportedSetupError(
        f"SCOUT cannot take over the checkpoint manager {cls.__module__}.{cls.__qualname__}: "
        "scout-torchtitan replaces TorchTitan's CheckpointManager and TorchFT's "
        "TorchFTCheckpointManager, and replacing a custom subclass with either would "
        "drop what it does. Give your manager SCOUT's behaviour with "
        "scout_torchtitan.manager.ScoutManagerMixin (class M(ScoutManagerMixin, YourManager) "
        "with a Config carrying `scout`) and select it in your config function."
    )


@override(  # type: ignore[untyped-decorator]  # torchtitan is untyped
    target=BaseCheckpointManager.Config,
    description="SCOUT: failure localization riding on the checkpoint manager",
)
def scout(cfg: Any, **settings: Any) -> Any:
    """Replace the job's checkpoint-manager config with SCOUT's, configured by ``settings``."""
    check_version()
    config = Config.from_mapping(settings, source=SECTION)
    return scout_checkpoint_config(cfg, config)
