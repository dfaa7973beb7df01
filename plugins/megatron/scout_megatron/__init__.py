"""SCOUT plugin for Megatron-Core (distribution ``scout-megatron``).

Not built yet: the plugin recognises Megatron model chunks so that
``scout.enable(model_chunks)`` reaches it, then raises
:class:`scout_core.errors.PluginNotReadyError`. Its own issue fills in the adapter
(parallel_state groups, the Bridge callback, the RNG tracker).
"""

from __future__ import annotations

from scout_core.plugin_api import PendingPlugin

__all__ = ["plugin"]

plugin = PendingPlugin("megatron", ("megatron.",), "scout-megatron")
