"""SCOUT plugin for TorchTitan 0.3 (distribution ``scout-torchtitan``).

One override switches SCOUT on; its JSON object holds :class:`scout_core.Config` keys::

    torchrun ... -m torchtitan.train --module llama3 --config llama3_8b \\
        --override.imports 'scout_torchtitan.overrides.scout={"replay_interval": 20}'

``ScoutTrainer`` (``--scout.*`` flags) and ``scout.enable(trainer)`` reach the same plugin;
:func:`recover` restores certified checkpoints. Imports no TorchTitan module. docs/torchtitan.md.
"""

from __future__ import annotations

from scout_torchtitan.plugin import SECTION, TitanPlugin, plugin, recover, session_of

__all__ = ["SECTION", "TitanPlugin", "plugin", "recover", "session_of"]
