"""benchmarks/healthy_path.py's summary (benchmarks/healthy_summary.py): the
critical-path figure counts what SCOUT's boundary held the job up, not the time an early
rank waited there for a late peer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import healthy_summary  # a script beside the package, not part of it

PERIOD = 20
STEPS = 60
DUE = 5  # the phase of the period where the one recipe is due


def _results(hold_s: float, early_wait_s: float, idle_s: float) -> list[dict[str, Any]]:
    """Two ranks, off steps of 1 s. At every due step rank 1 reaches the boundary
    ``early_wait_s`` after rank 0 and both leave it ``hold_s`` after rank 1 arrived; on
    an idle step each spends ``idle_s`` there, arriving together."""
    ranks = []
    for rank in range(2):
        scout, times_on = [], []
        for i in range(STEPS):
            due = i % PERIOD == DUE
            t = 100.0 * i
            enter = t + (early_wait_s if due and rank == 1 else 0.0)
            leave = t + early_wait_s + hold_s if due else t + idle_s
            scout.append(
                {
                    "boundary": leave - enter,
                    "coll": 0.0,
                    "coll_n": 4.0 if due else 0.0,
                    "capture": 0.0,
                    "enter_at": enter,
                    "leave_at": leave,
                }
            )
            times_on.append(1.0 + (hold_s if due else idle_s))
        ranks.append(
            {
                "period": PERIOD,
                "times": {"on": times_on, "off": [1.0] * STEPS},
                "scout": scout,
                "kinds": [["hidden"] if i % PERIOD == DUE else [] for i in range(STEPS)],
                "verdicts": 0,
                "memory": {},
                "estimate": {
                    "paper_v_over_i_n": 0.004,
                    "with_extras": 0.005,
                    "per_recipe": {"hidden": 0.005},
                },
            }
        )
    return ranks


def test_critical_path_counts_the_late_ranks_time_in_the_boundary() -> None:
    hold, wait, idle = 0.1, 0.03, 1e-4
    out = healthy_summary.summarise(_results(hold, wait, idle), warm=0)
    period_s = PERIOD * 1.0
    # One due phase held the job up for `hold`, each of the 19 idle ones for `idle`; the
    # early rank's 30 ms wait for its peer is not SCOUT's.
    expected = (hold + (PERIOD - 1) * idle) / period_s
    assert out["critical_path_overhead"] == pytest.approx(expected)
    assert out["critical_path_over_estimate"] == pytest.approx(expected / 0.005)
    hidden = out["per_recipe"]["hidden"]
    assert hidden["critical_ms"] == pytest.approx(1e3 * hold)
    assert hidden["boundary_ms"] == pytest.approx(1e3 * (hold + wait))  # rank 0 waited
    assert hidden["collectives"] == 4.0
    # The paired step-time figure sees the same cost.
    assert out["overhead_paired_median"] == pytest.approx(expected)
