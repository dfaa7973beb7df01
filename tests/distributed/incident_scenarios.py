"""Rank bodies for the incident acceptance runs (``test_incidents.py``); each returns JSON."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from replay_scenarios import _faults, build, data_rank


def run(
    setup: str, faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any]
) -> dict[str, Any]:
    """Train with SCOUT and ``faults``; return this rank's verdicts, its incidents and
    the incidents in its report directory."""
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.records.evidence import load_report
    from scout_core.testing.models import train_step

    rank = dist.get_rank()
    wrapped, _, mesh = build(setup)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    _faults(faults).attach(wrapped, opt)
    report = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report")
    base: dict[str, Any] = {
        "report_dir": report,
        "run_id": "incidents",
        "replay_interval": 1,
        "observer": False,
        "gate": False,
    }
    base.update(cfg)
    with enable_torch(wrapped, opt, Config(**base), mesh=mesh) as session:
        for step in range(steps):
            train_step(wrapped, opt, step, data_rank(setup, rank))
        verdicts = [r.to_dict() | {"id": r.id} for r in session.verdicts]
        incidents = [r.to_dict() | {"id": r.id} for r in session.incidents]
    on_disk = (
        [r.to_dict() | {"id": r.id} for r in load_report(report).incidents()]
        if os.path.isdir(report)
        else []
    )
    return {"rank": rank, "verdicts": verdicts, "incidents": incidents, "on_disk": on_disk}
