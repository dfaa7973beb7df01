"""SCOUT plugin for TorchTitan (distribution ``scout-torchtitan``).

Not built yet: the plugin recognises TorchTitan trainers so that
``scout.enable(trainer)`` reaches it, then raises
:class:`scout_core.errors.PluginNotReadyError`. Its own issue fills in the adapter
(ParallelDims meshes, the checkpoint-manager override).
"""

from __future__ import annotations

from scout_core.plugin_api import PendingPlugin

__all__ = ["plugin"]

plugin = PendingPlugin("torchtitan", ("torchtitan.",), "scout-torchtitan")
