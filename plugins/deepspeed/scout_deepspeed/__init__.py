"""SCOUT plugin for DeepSpeed (distribution ``scout-deepspeed``).

Not built yet: the plugin recognises DeepSpeed engines so that
``scout.enable(engine)`` reaches it, then raises
:class:`scout_core.errors.PluginNotReadyError`. Its own issue fills in the engine
hook and the ``"scout"`` section of the DeepSpeed JSON config.
"""

from __future__ import annotations

from scout_core.plugin_support import PendingPlugin

__all__ = ["plugin"]

plugin = PendingPlugin("deepspeed", ("deepspeed.",), "scout-deepspeed")
