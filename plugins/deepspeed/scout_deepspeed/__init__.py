"""SCOUT plugin for DeepSpeed (distribution ``scout-deepspeed``).

Add a top-level ``"scout"`` section to the DeepSpeed JSON config, then either call
``scout.enable(engine)`` after ``deepspeed.initialize`` or use
:func:`scout_deepspeed.initialize` in its place. SCOUT then replays sampled layers
of ``engine.module`` at the inner optimizer's step boundary and compares each rank
with its peers (data-parallel replicas under ZeRO 0-2, the shard group under ZeRO-3,
per stage under a ``PipelineEngine``), and gates ``engine.save_checkpoint`` /
``load_checkpoint`` through the core's checkpoint gate (:func:`recover`). See
``docs/deepspeed.md`` and, for how the plugin is built, ``docs/plugins.md``.
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
