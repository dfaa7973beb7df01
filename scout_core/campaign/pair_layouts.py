"""The campaign setups where every peer group holds two replicas, as multi-rank tests
use them: a vote names nobody there, so what names a rank must come from elsewhere
(the observers' wait-for graph, a timing pool, a rank's own history).

Each is a real training job of ``scout campaign``'s rank bodies, Gloo on CPU: DDP x 2,
HSDP 2 x 2 (FSDP2), DP 2 x TP 2 (DTensor TP + DDP), and 2 pipeline stages x DP 2
(DeepSpeed ``PipelineEngine``, rank = stage * 2 + data index; only where the DeepSpeed
plugin registers its setups).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from scout_core.campaign.plan import SETUPS, Setup, setup_named

__all__ = ["BLOCKS", "PAIR_LAYOUTS"]

_PIPELINE = "deepspeed-pipeline"

PAIR_LAYOUTS: Mapping[str, Setup] = {
    "ddp2": dataclasses.replace(setup_named("ddp"), name="ddp2", world=2),
    "hsdp2x2": setup_named("hsdp"),
    "dp2xtp2": setup_named("dptp"),
    **({"pp2xdp2": setup_named(_PIPELINE)} if _PIPELINE in {s.name for s in SETUPS} else {}),
}
"""The layouts (module doc), by test name."""

BLOCKS: Mapping[str, int] = {"ddp2": 4, "hsdp2x2": 4, "dp2xtp2": 4, "pp2xdp2": 2}
"""Repeated blocks each rank holds (and a trial's compute fault spreads its delay over):
TinyLM's four, or two per pipeline stage."""
