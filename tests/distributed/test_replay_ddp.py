"""Replay on DDP with 4 ranks: SDC, optimizer state, stragglers, clean runs, bitwise, skips.

Each case follows the paper's protocol (clean step, injected step, clean step) with
replay at every step; the model has 4 layers, so layer ``k`` is sampled at steps
``k, k+4, ...``.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

WORLD = 4
ENV = {"OMP_NUM_THREADS": "1"}


def _run(faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any] | None = None) -> list[Any]:
    from replay_scenarios import scenario

    return run_ranks(
        scenario, WORLD, args=("ddp", faults, steps, cfg or {}), timeout_s=150, env=ENV
    )


def _verdicts(results: list[Any]) -> list[dict[str, Any]]:
    """Every rank sees the same verdicts; check that and return rank 0's."""
    first = [(v["step"], v["surface"], v["failure"], v["outliers"]) for v in results[0]["verdicts"]]
    for res in results[1:]:
        mine = [(v["step"], v["surface"], v["failure"], v["outliers"]) for v in res["verdicts"]]
        assert mine == first
    verdicts: list[dict[str, Any]] = results[0]["verdicts"]
    return verdicts


@pytest.mark.timeout(200)
def test_output_bitflip_names_the_rank() -> None:
    faults = [{"rank": 2, "step": 2, "kind": "output", "target": "layers.2", "how": ["bitflip", 0]}]
    results = _run(faults, steps=4, cfg={"recipes": ["hidden"]})
    verdicts = _verdicts(results)
    assert [
        (v["step"], v["surface"], v["failure"], v["outliers"], v["scope"]) for v in verdicts
    ] == [(2, "layer/layers.2/forward", "sdc", [2], "rank")]
    assert results[2]["fired"] == [["output", "layers.2", 2]]


@pytest.mark.timeout(200)
def test_parameter_sdc_found_within_one_rotation() -> None:
    faults = [
        {
            "rank": 3,
            "step": 4,
            "kind": "param",
            "target": "layers.1.fc1.weight",
            "how": ["bitflip", 0, 5],
        }
    ]
    verdicts = _verdicts(_run(faults, steps=8))
    assert verdicts, "the corrupted parameter was never reported"
    assert all(v["step"] >= 4 for v in verdicts), "a report before the injection"
    assert all(v["failure"] == "sdc" and v["outliers"] == [3] for v in verdicts)
    layer = [v for v in verdicts if v["surface"].startswith("layer/layers.1/")]
    assert layer and min(v["step"] for v in layer) == 5  # layer 1 is sampled at step 5
    assert {"layer/layers.1/params", "layer/layers.1/forward"} <= {v["surface"] for v in layer}


@pytest.mark.timeout(200)
def test_optimizer_state_corruption_on_the_optimizer_surface() -> None:
    faults = [
        {
            "rank": 1,
            "step": 2,
            "kind": "optim",
            "target": "layers.0.fc1.weight",
            "key": "exp_avg",
            "how": ["scale", 3.0],
        }
    ]
    verdicts = _verdicts(_run(faults, steps=4, cfg={"recipes": ["optimizer"]}))
    assert verdicts
    assert min(v["step"] for v in verdicts) == 2
    assert all(v["failure"] == "sdc" and v["outliers"] == [1] for v in verdicts)
    at_injection = {v["surface"] for v in verdicts if v["step"] == 2}
    assert "optimizer/result" in at_injection


@pytest.mark.timeout(200)
def test_compute_straggler_after_two_rounds_and_no_sdc() -> None:
    faults = [
        {"rank": 3, "step": s, "kind": "delay", "target": f"layers.{s % 4}", "seconds": 0.2}
        for s in (2, 3, 4)
    ]
    verdicts = _verdicts(_run(faults, steps=6, cfg={"recipes": ["hidden"]}))
    assert [(v["step"], v["failure"], v["outliers"]) for v in verdicts] == [
        (3, "straggler", [3]),
        (4, "straggler", [3]),
    ]


@pytest.mark.timeout(200)
def test_collective_delay_is_group_scoped_without_straggler_or_sdc() -> None:
    # Rank 2 stalls 200 ms inside every timed replay broadcast of steps 2-4 (as a slow
    # link at rank 2 would). Everyone who waits for it sees a long interval, so the
    # group's broadcast time is judged against its own clean rounds: group-scoped.
    faults = [
        {"rank": 2, "step": s, "kind": "collective", "group": "replica", "seconds": 0.2}
        for s in (2, 3, 4)
    ]
    results = _run(faults, steps=6, cfg={"recipes": ["hidden"]})
    assert results[2]["fired"] == [["collective", "replica", s] for s in (2, 3, 4)]
    verdicts = _verdicts(results)
    assert [(v["step"], v["failure"], v["outliers"], v["scope"]) for v in verdicts] == [
        (3, "comm_straggler", [0, 1, 2, 3], "group"),
        (4, "comm_straggler", [0, 1, 2, 3], "group"),
    ]
    assert all(v["surface"].endswith("/t_bcast") for v in verdicts)


@pytest.mark.timeout(200)
def test_skipped_capture_is_inconclusive_and_training_goes_on() -> None:
    faults = [{"rank": 1, "step": 2, "kind": "skip"}]
    results = _run(faults, steps=5)
    verdicts = _verdicts(results)
    assert verdicts
    assert {v["step"] for v in verdicts} == {2}
    assert all(v["status"] == "inconclusive" and v["failure"] is None for v in verdicts)
    assert {v["surface"] for v in verdicts} == {
        "layer/layers.2/ready",
        "layer/embed/ready",
        "layer/head/ready",
    }
    assert all(r["rounds"] == 5 * 4 for r in results)  # every round ran, none hung


@pytest.mark.timeout(300)
def test_clean_run_of_30_steps_reports_nothing() -> None:
    results = _run([], steps=30)
    assert _verdicts(results) == []
    assert results[0]["rounds"] == 30 * 4


@pytest.mark.timeout(200)
def test_training_is_bitwise_identical_with_scout_on() -> None:
    from replay_scenarios import bitwise

    results = run_ranks(bitwise, WORLD, args=("ddp", 6), timeout_s=150, env=ENV)
    for res in results:
        assert res["rounds"] == 6 * 4
        assert res["verdicts"] == []
        assert res["on"] == res["off"]
