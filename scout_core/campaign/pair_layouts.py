"""The campaign setups where every peer group holds two replicas, for multi-rank tests.

A vote names nobody there, so what names a rank must come from elsewhere (the wait-for
graph, a timing pool, a rank's own history). Layouts: DDP x 2, HSDP 2 x 2, DP 2 x TP 2,
and, where the DeepSpeed plugin registers it, 2 pipeline stages x DP 2 (rank = stage * 2 +
data index).
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
"""Repeated blocks each rank holds, which a compute fault spreads its delay over."""
