"""Rank bodies for the DeepSpeed hang tests: a rank frozen with SIGSTOP, observer on.

Before step ``at_step`` the culprit writes ``freeze-ready`` into the ranks' scratch
folder and idles a moment, in which the test stops it with ``SIGSTOP``; the other
ranks go on into the step's collectives and wait there. The test continues the
culprit once the verdict is out, so the job finishes and every rank reports the
verdicts its session received.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from ds_scenarios import (
    build_pipeline,
    pipeline_batches,
    train_step,
    zero_engine,
)


def _freeze_point(culprit: int, at_step: int, step: int) -> None:
    if dist.get_rank() != culprit or step != at_step:
        return
    marker = Path(os.environ["SCOUT_TEST_RANK_DIR"]) / "freeze-ready"
    marker.with_suffix(".tmp").write_text(str(os.getpid()))
    marker.with_suffix(".tmp").rename(marker)
    time.sleep(1.5)  # stopped here, outside any collective


def zero_hang(
    stage: int, culprit: int, at_step: int, steps: int, section: dict[str, Any]
) -> dict[str, Any]:
    """A ZeRO-``stage`` engine with the observer on; the culprit freezes at ``at_step``."""
    rank = dist.get_rank()
    engine, session = zero_engine(stage, section)
    for step in range(steps):
        _freeze_point(culprit, at_step, step)
        train_step(engine, step, rank)
    out = {"rank": rank, "steps": session.step, "verdicts": [v.to_dict() for v in session.verdicts]}
    session.close()
    return out


def pipeline_hang(
    culprit: int, at_step: int, steps: int, section: dict[str, Any]
) -> dict[str, Any]:
    """The 2-stage pipeline with the observer on; the culprit freezes at ``at_step``."""
    engine, session = build_pipeline(section)
    for step in range(steps):
        _freeze_point(culprit, at_step, step)
        engine.train_batch(data_iter=pipeline_batches(engine, step))
    out = {
        "rank": dist.get_rank(),
        "stage": engine.grid.get_stage_id(),
        "steps": session.step,
        "peers": list(session.adapter.layout().peer_group(dist.get_rank()).ranks),
        "verdicts": [v.to_dict() for v in session.verdicts],
    }
    session.close()
    return out
