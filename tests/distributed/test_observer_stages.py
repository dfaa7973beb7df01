"""A rank left behind inside the DataLoader fetch or a checkpoint write, while its
peers wait in the next collective, is an ``input_stall`` / ``checkpoint_stall`` on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from observer_scenarios import free_port, scenario

from scout_core.records.evidence import load_report
from scout_core.testing.harness import retry_on_port_clash, run_ranks

CULPRIT = 1
WORLD = 3
"""A stalled rank is named against a strict majority of the ranks' progress (two against
one); no layout is involved, so a fourth rank would only add load."""


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("name", "failure", "surface", "stage"),
    [
        ("input_stall", "input_stall", "stage/dataloader", "dataloader"),
        ("checkpoint_stall", "checkpoint_stall", "stage/checkpoint", "checkpoint_write"),
    ],
)
def test_rank_stuck_in_a_stage(
    tmp_path: Path, name: str, failure: str, surface: str, stage: str
) -> None:
    report = tmp_path / "report"
    results = retry_on_port_clash(
        lambda: run_ranks(
            scenario, WORLD, args=(name, free_port(), str(report), CULPRIT), timeout_s=120
        )
    )
    verdicts = load_report(report).verdicts()
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == (failure, "attributed", [CULPRIT])
    assert v.surface == surface
    assert v.detail["stages"][str(CULPRIT)] == stage
    assert v.detail["position"] == {str(CULPRIT): "behind"}
    assert all("error" not in r for r in results)  # training went on after the stall
    assert all(r["stats"]["rounds"] == 1 for r in results)
