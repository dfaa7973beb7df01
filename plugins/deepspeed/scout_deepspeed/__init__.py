"""SCOUT plugin for DeepSpeed (distribution ``scout-deepspeed``).

Add a ``"scout"`` section to the DeepSpeed JSON config, then call ``scout.enable(engine)``
after ``deepspeed.initialize`` or use :func:`scout_deepspeed.initialize` in its place.
SCOUT replays sampled layers at the inner optimizer's step boundary, compares each rank
with its peers, and gates ``save_checkpoint`` / ``load_checkpoint`` (:func:`recover`).
Docs: ``docs/deepspeed.md``; how the plugin is built: ``docs/plugins.md``.
"""

from __future__ import annotations

from scout_deepspeed.gating import DeepSpeedCheckpointIO, Recovered, gate_of, recover
from scout_deepspeed.plugin import (
    SECTION,
    SUPPORTED_DEEPSPEED,
    DeepSpeedPlugin,
    check_version,
    config_for,
    enable,
    initialize,
    plugin,
    section_config,
    session_of,
)

__all__ = [
    "plugin",
    "initialize",
    "enable",
    "session_of",
    "recover",
    "Recovered",
    "gate_of",
    "config_for",
    "section_config",
    "SECTION",
    "DeepSpeedPlugin",
    "SUPPORTED_DEEPSPEED",
    "check_version",
    "DeepSpeedCheckpointIO",
]
