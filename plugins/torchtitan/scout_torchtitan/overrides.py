"""The switch: ``--override.imports 'scout_torchtitan.overrides.scout={"replay_interval": 20}'``.

TorchTitan 0.3 imports ``scout_torchtitan.overrides`` (the module part of the
target), finds the ``@override`` factory :func:`scout` and, inside
``Trainer.__init__`` after the meshes exist and before any component is built,
replaces the job's checkpoint-manager config with what the factory returns. The
JSON object after ``=`` holds SCOUT settings with exactly the keys of
:class:`scout_core.Config` (``replay_interval``, ``report_dir``, ``hang_timeout_s``
...), validated here by ``Config.from_mapping``: an unknown key or a wrong type
fails the job at start-up with a :class:`~scout_core.ConfigError` naming the key.
The same entry works from a config function:
``override=OverrideConfig(imports=[("scout_torchtitan.overrides.scout", {...})])``.

[Why not ``exact=True``]
``@override(target=CheckpointManager.Config, exact=True)`` would claim only the
stock manager and skip subclasses *silently* (TorchTitan merely logs that the
override "produced no replacements"): a TorchFT job would run without SCOUT while
its user believes SCOUT is on. The factory is therefore registered for every
checkpoint-manager config (``BaseCheckpointManager.Config``, subclasses included)
and dispatches on the concrete class:

* TorchTitan's ``CheckpointManager.Config`` → :class:`ScoutCheckpointManager.Config`;
* TorchFT's ``TorchFTCheckpointManager.Config`` →
  :class:`~scout_torchtitan.torchft.ScoutTorchFTCheckpointManager.Config` (keeps the
  fault-tolerance behaviour);
* an already-SCOUT config → the same class with the new settings;
* any other manager → :class:`~scout_core.UnsupportedSetupError` naming its class,
  before anything is built. Replacing it with the stock manager would silently drop
  what the subclass does.
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
