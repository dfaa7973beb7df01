"""Replay on DP x TP 3x2 (6 ranks): DDP over ``dp``, tensor parallelism on ``tp``.

Replica peers vary ``d`` at a fixed ``t``: groups (0, 2, 4) and (1, 3, 5); TP
partners are (0, 1), (2, 3), (4, 5). Each sampled TP block is gathered on SCOUT's
own TP group (``t_gather``), run without the TP hooks on full tensors, and compared
across replica peers; local TP shards are compared first, so a corrupted shard names
its holder and never its TP partner, whose gathered parameters inherit it.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing import ran_every_due_round
from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

WORLD = 6
ENV = {"OMP_NUM_THREADS": "1"}


def _run(faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any] | None = None) -> list[Any]:
    from replay_scenarios import scenario

    return run_ranks(
        scenario, WORLD, args=("dptp", faults, steps, cfg or {}), timeout_s=200, env=ENV
    )


def _all(results: list[Any]) -> set[tuple[Any, ...]]:
    """Distinct verdicts over all ranks (each replica group judges its own round)."""
    return {
        (v["step"], v["surface"], v["status"], v["failure"], tuple(v["outliers"]), v["scope"])
        for res in results
        for v in res["verdicts"]
    }


@pytest.mark.timeout(250)
def test_dptp_parameter_sdc_names_only_the_owner() -> None:
    faults = [
        {
            "rank": 2,
            "step": 4,
            "kind": "param",
            "target": "layers.1.fc1.weight",
            "how": ["bitflip", 0, 3],
        }
    ]
    results = _run(faults, steps=6, cfg={"recipes": ["hidden"]})
    assert results[2]["fired"] == [["param", "layers.1.fc1.weight", 4]]
    verdicts = _all(results)
    sdc = {v for v in verdicts if v[3] == "sdc"}
    assert {v[1] for v in sdc} >= {"layer/layers.1/shard", "layer/layers.1/params"}
    assert all(v[4] == (2,) and v[5] == "rank" for v in sdc)
    assert min(v[0] for v in sdc) == 5  # layer 1 is sampled at step 5
    # TP partner 3 gathers the corrupted shard too; its group (1, 3, 5) names nobody.
    rest = verdicts - sdc
    assert rest == {(5, "layer/layers.1/params", "inconclusive", None, (), "group")}


@pytest.mark.slow  # the parameter SDC above runs in CI
@pytest.mark.timeout(250)
def test_dptp_output_bitflip_names_the_rank() -> None:
    faults = [{"rank": 3, "step": 2, "kind": "output", "target": "layers.2", "how": ["bitflip", 0]}]
    results = _run(faults, steps=4, cfg={"recipes": ["hidden"]})
    assert _all(results) == {(2, "layer/layers.2/forward", "attributed", "sdc", (3,), "rank")}
    assert results[0]["verdicts"] == []  # the other replica group saw nothing


@pytest.mark.slow  # DDP's and HSDP's (sharded) run in CI
@pytest.mark.timeout(250)
def test_dptp_optimizer_state_corruption_on_the_optimizer_surface() -> None:
    faults = [
        {
            "rank": 4,
            "step": 2,
            "kind": "optim",
            "target": "layers.0.fc1.weight",
            "key": "exp_avg",
            "how": ["scale", 3.0],
        }
    ]
    results = _run(faults, steps=4, cfg={"recipes": ["optimizer"]})
    verdicts = _all(results)
    assert verdicts
    assert all(v[3] == "sdc" and v[4] == (4,) and v[5] == "rank" for v in verdicts)
    assert min(v[0] for v in verdicts) == 2
    assert (2, "optimizer/result", "attributed", "sdc", (4,), "rank") in verdicts


@pytest.mark.timeout(250)
def test_dptp_compute_straggler_and_no_sdc() -> None:
    faults = [
        {"rank": 5, "step": s, "kind": "delay", "target": f"layers.{s % 4}", "seconds": 0.2}
        for s in (2, 3, 4)
    ]
    results = _run(faults, steps=6, cfg={"recipes": ["hidden"]})
    assert {(v[0], v[3], v[4], v[5]) for v in _all(results)} == {
        (3, "straggler", (5,), "rank"),
        (4, "straggler", (5,), "rank"),
    }


@pytest.mark.timeout(250)
def test_dptp_collective_delay_is_group_scoped() -> None:
    faults = [
        {"rank": 2, "step": s, "kind": "collective", "group": "tp", "seconds": 0.4}
        for s in (2, 3, 4)
    ]
    results = _run(faults, steps=6, cfg={"recipes": ["hidden"]})
    verdicts = _all(results)
    assert verdicts
    # The slow TP group (2, 3), as seen from both replica groups; no rank, no SDC.
    assert {(v[3], v[4], v[5]) for v in verdicts} == {("comm_straggler", (2, 3), "group")}
    assert min(v[0] for v in verdicts) == 3


@pytest.mark.slow  # DDP's runs in CI
@pytest.mark.timeout(250)
def test_dptp_skipped_capture_is_inconclusive_and_training_goes_on() -> None:
    # Rank 1's group (1, 3, 5) is not ready; its TP partners (0, 2, 4) must not enter
    # the TP gather alone, so both groups read inconclusive and nobody hangs.
    faults = [{"rank": 1, "step": 1, "kind": "skip"}]
    results = _run(faults, steps=3, cfg={"recipes": ["hidden"]})
    assert _all(results) == {(1, "layer/layers.1/ready", "inconclusive", None, (), "group")}
    assert all(ran_every_due_round(res, 3) for res in results)


@pytest.mark.timeout(300)
def test_dptp_clean_run_reports_nothing() -> None:
    results = _run([], steps=30)
    assert _all(results) == set()
    assert all(ran_every_due_round(res, 30) for res in results)


@pytest.mark.timeout(250)
def test_dptp_training_is_bitwise_identical_with_scout_on() -> None:
    from replay_scenarios import bitwise

    results = run_ranks(bitwise, WORLD, args=("dptp", 5), timeout_s=200, env=ENV)
    for res in results:
        assert ran_every_due_round(res, 5)
        assert res["verdicts"] == []
        assert res["on"] == res["off"]


@pytest.mark.slow  # DDP's runs in CI, and DP x TP's straggler above
@pytest.mark.timeout(250)
def test_dptp_compute_straggler_with_the_default_config() -> None:
    # Every recipe on, all intervals 2: hidden layer k at step 2k + 1, the embedding and
    # LM head at even steps. The hidden layers' straggler streak is its own.
    faults = [
        {
            "rank": 5,
            "step": s,
            "kind": "delay",
            "target": f"layers.{(s - 1) // 2 % 4}",
            "seconds": 0.2,
        }
        for s in (3, 5, 7)
    ]
    cfg = dict.fromkeys(
        ("replay_interval", "embedding_interval", "lm_head_interval", "optimizer_interval"), 2
    )
    results = _run(faults, steps=9, cfg=cfg)
    assert {(v[0], v[3], v[4], v[5]) for v in _all(results)} == {
        (5, "straggler", (5,), "rank"),
        (7, "straggler", (5,), "rank"),
    }
