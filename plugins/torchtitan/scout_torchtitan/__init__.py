"""SCOUT plugin for TorchTitan 0.3 (distribution ``scout-torchtitan``).

Not switched on yet: ``scout.enable(trainer)`` reaches this plugin and raises
:class:`scout_core.errors.PluginNotReadyError`. The groundwork is in place and
tested against a real TorchTitan ``Trainer`` (see ``NOTES.md`` beside this package):

* :mod:`scout_torchtitan.overrides` / :mod:`scout_torchtitan.manager`: the seam,
  ``--override.imports 'scout_torchtitan.overrides.scout={...}'`` swapping in a
  checkpoint manager that is built with the whole trainer;
  :mod:`scout_torchtitan.trainer`: the optional ``ScoutTrainer`` with ``--scout.*``;
* :mod:`scout_torchtitan.layout`, :mod:`~scout_torchtitan.modules`,
  :mod:`~scout_torchtitan.optimizers`, :mod:`~scout_torchtitan.rng`: framework facts;
* :mod:`scout_torchtitan.replay`: what replay must undo on a TorchTitan TP block;
* :mod:`scout_torchtitan.checkpoint_io`: TorchTitan's checkpoints as a CheckpointIO;
* :mod:`scout_torchtitan.versions`: the supported range (0.3.x);
* :mod:`scout_torchtitan.testing`: CPU shims, generated assets, a tiny config.

Importing this package imports no TorchTitan module.
"""

from __future__ import annotations

from scout_core.plugin_api import PendingPlugin

__all__ = ["plugin"]

plugin = PendingPlugin("torchtitan", ("torchtitan.",), "scout-torchtitan")
"""The torchtitan plugin is discoverable, declines foreign objects and refuses clearly."""
