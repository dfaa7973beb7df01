"""The SCOUT configuration every campaign trial runs under, and its fault's timing.

One configuration for every setup and fault kind, so a score is about SCOUT, not a
per-fault tuning (docs/campaign.md). The hang timeout is short but still several healthy
steps long on a loaded CPU box; the gate is off because a trial scores localization, not
recovery. The runner sends the settings to the rank bodies as JSON (``trial["scout"]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scout_core.config import Config

__all__ = ["HANG_TIMEOUT_S", "STALL_S", "fault_spec", "trial_settings"]

HANG_TIMEOUT_S = 3.0
STALL_S = HANG_TIMEOUT_S + 3.0
"""How long a hang or stall lasts: past the verdict, then training goes on."""
DELAY_S = 0.2
"""A straggler's extra time per step (compute: spread over the blocks; communication:
in each of SCOUT's timed collectives)."""


def fault_spec(kind: str, victim: int | None, step: int) -> dict[str, Any]:
    """The :class:`~scout_core.testing.trial.TrialFault` spec of a drawn trial."""
    return {
        "kind": kind,
        "rank": -1 if victim is None else victim,
        "step": step,
        "stall_s": STALL_S,
        "delay_s": DELAY_S,
        "window": 4,
    }


def trial_settings(report_dir: str, trial: Mapping[str, Any]) -> dict[str, Any]:
    """The SCOUT settings of one trial (module doc), as ``Config`` keyword arguments."""
    fields: dict[str, Any] = {
        "report_dir": report_dir,
        "run_id": f"campaign-{trial['index']}",
        "replay_interval": 1,
        "optimizer_interval": 1,
        "embedding_interval": 4,
        "lm_head_interval": 4,
        "observer": True,
        "hang_timeout_s": HANG_TIMEOUT_S,
        "gate": False,
    }
    Config(**fields)  # valid now, not in four ranks later
    return fields
