"""SCOUT plugin for TorchTitan 0.3 (distribution ``scout-torchtitan``).

Switch SCOUT on for any TorchTitan job with one override, whose JSON object holds
the keys of :class:`scout_core.Config`::

    torchrun ... -m torchtitan.train --module llama3 --config llama3_8b \\
        --override.imports 'scout_torchtitan.overrides.scout={"replay_interval": 20}'

SCOUT's checkpoint manager (:mod:`scout_torchtitan.manager`) then attaches to the
trainer while TorchTitan builds it: replay of sampled layers compared across
``dp_replicate`` replicas, the hang observer, and TorchTitan's own checkpoints
certified by the replay evidence (:func:`recover`). ``ScoutTrainer`` with
``--scout.*`` flags (:mod:`scout_torchtitan.trainer`) and ``scout.enable(trainer)``
reach the same plugin. See ``docs/torchtitan.md``.

* :mod:`~scout_torchtitan.plugin`: the ``scout.plugins`` entry point;
  :mod:`~scout_torchtitan.adapter`: the trainer's facts for the core;
* :mod:`~scout_torchtitan.layout`, :mod:`~scout_torchtitan.modules`,
  :mod:`~scout_torchtitan.optimizers`, :mod:`~scout_torchtitan.replay`: those facts;
* :mod:`~scout_torchtitan.checkpoint_io`, :mod:`~scout_torchtitan.gating`:
  TorchTitan's checkpoints through the core's gate;
* :mod:`~scout_torchtitan.overrides`, :mod:`~scout_torchtitan.manager`,
  :mod:`~scout_torchtitan.trainer`: the switches;
* :mod:`~scout_torchtitan.versions`: the supported range (0.3.x);
* :mod:`scout_torchtitan.testing`: CPU shims, generated assets, a tiny config.

Importing this package imports no TorchTitan module.
"""

from __future__ import annotations

from scout_torchtitan.plugin import SECTION, TitanPlugin, plugin, recover, session_of

__all__ = ["SECTION", "TitanPlugin", "plugin", "recover", "session_of"]
