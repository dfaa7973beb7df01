"""Replay on DP x TP 3x2 (6 ranks): DDP over ``dp``, tensor parallelism on ``tp``.

Replica peers vary ``d`` at a fixed ``t``: groups (0, 2, 4) and (1, 3, 5); TP
partners are (0, 1), (2, 3), (4, 5). Each sampled TP block is gathered on SCOUT's
own TP group (``t_gather``), run without the TP hooks on full tensors, and compared
across replica peers; local TP shards are compared first, so a corrupted shard names
its holder and never its TP partner, whose gathered parameters inherit it.

The cases share one setup, so the selected tests' cases run in one job, one after
another (``scout_core.testing.shared_jobs``, fixture ``dptp``), and each test asserts on
its own case's results.
"""

from __future__ import annotations

from typing import Any

import pytest
from replay_scenarios import bitwise, scenario

from scout_core.testing import ran_every_due_round
from scout_core.testing.shared_jobs import CaseResults, SharedJob, selected_cases

# The first test to ask for the job waits for all of it (and, if it failed, for its own
# case alone): the limit covers both.
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

JOB = SharedJob(6, timeout_s=600, case_timeout_s=200, env={"OMP_NUM_THREADS": "1"})


def run(faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any] | None = None) -> Any:
    """The decorated test's case: ``scenario`` trains ``steps`` with ``faults``, config
    ``cfg``."""
    return JOB.case(scenario, "dptp", faults, steps, cfg or {})


@pytest.fixture(scope="module")
def dptp(request: pytest.FixtureRequest) -> CaseResults:
    """Every selected test's case, run in one 6-rank job: the ranks' results by case."""
    return JOB.run(selected_cases(request.session.items, request.module))


def _all(results: list[Any]) -> set[tuple[Any, ...]]:
    """Distinct verdicts over all ranks (each replica group judges its own round)."""
    return {
        (v["step"], v["surface"], v["status"], v["failure"], tuple(v["outliers"]), v["scope"])
        for res in results
        for v in res["verdicts"]
    }


@run(
    [
        {
            "rank": 2,
            "step": 4,
            "kind": "param",
            "target": "layers.1.fc1.weight",
            "how": ["bitflip", 0, 3],
        }
    ],
    6,
    {"recipes": ["hidden"]},
)
def test_dptp_parameter_sdc_names_only_the_owner(dptp: CaseResults) -> None:
    results = dptp["test_dptp_parameter_sdc_names_only_the_owner"]
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
@run(
    [{"rank": 3, "step": 2, "kind": "output", "target": "layers.2", "how": ["bitflip", 0]}],
    4,
    {"recipes": ["hidden"]},
)
def test_dptp_output_bitflip_names_the_rank(dptp: CaseResults) -> None:
    results = dptp["test_dptp_output_bitflip_names_the_rank"]
    assert _all(results) == {(2, "layer/layers.2/forward", "attributed", "sdc", (3,), "rank")}
    assert results[0]["verdicts"] == []  # the other replica group saw nothing


@pytest.mark.slow  # DDP's and HSDP's (sharded) run in CI
@run(
    [
        {
            "rank": 4,
            "step": 2,
            "kind": "optim",
            "target": "layers.0.fc1.weight",
            "key": "exp_avg",
            "how": ["scale", 3.0],
        }
    ],
    4,
    {"recipes": ["optimizer"]},
)
def test_dptp_optimizer_state_corruption_on_the_optimizer_surface(dptp: CaseResults) -> None:
    results = dptp["test_dptp_optimizer_state_corruption_on_the_optimizer_surface"]
    verdicts = _all(results)
    assert verdicts
    assert all(v[3] == "sdc" and v[4] == (4,) and v[5] == "rank" for v in verdicts)
    assert min(v[0] for v in verdicts) == 2
    assert (2, "optimizer/result", "attributed", "sdc", (4,), "rank") in verdicts


@run(
    [
        {"rank": 5, "step": s, "kind": "delay", "target": f"layers.{s % 4}", "seconds": 0.2}
        for s in (2, 3, 4)
    ],
    6,
    {"recipes": ["hidden"]},
)
def test_dptp_compute_straggler_and_no_sdc(dptp: CaseResults) -> None:
    results = dptp["test_dptp_compute_straggler_and_no_sdc"]
    assert {(v[0], v[3], v[4], v[5]) for v in _all(results)} == {
        (3, "straggler", (5,), "rank"),
        (4, "straggler", (5,), "rank"),
    }


@run(
    [
        {"rank": 2, "step": s, "kind": "collective", "group": "tp", "seconds": 0.4}
        for s in (2, 3, 4)
    ],
    6,
    {"recipes": ["hidden"]},
)
def test_dptp_collective_delay_is_group_scoped(dptp: CaseResults) -> None:
    results = dptp["test_dptp_collective_delay_is_group_scoped"]
    verdicts = _all(results)
    assert verdicts
    # The slow TP group (2, 3), as seen from both replica groups; no rank, no SDC.
    assert {(v[3], v[4], v[5]) for v in verdicts} == {("comm_straggler", (2, 3), "group")}
    assert min(v[0] for v in verdicts) == 3


# Rank 1's group (1, 3, 5) is not ready; its TP partners (0, 2, 4) must not enter the TP
# gather alone, so both groups read inconclusive and nobody hangs.
@pytest.mark.slow  # DDP's runs in CI
@run([{"rank": 1, "step": 1, "kind": "skip"}], 3, {"recipes": ["hidden"]})
def test_dptp_skipped_capture_is_inconclusive_and_training_goes_on(dptp: CaseResults) -> None:
    results = dptp["test_dptp_skipped_capture_is_inconclusive_and_training_goes_on"]
    assert _all(results) == {(1, "layer/layers.1/ready", "inconclusive", None, (), "group")}
    assert all(ran_every_due_round(res, 3) for res in results)


@run([], 30)
def test_dptp_clean_run_reports_nothing(dptp: CaseResults) -> None:
    results = dptp["test_dptp_clean_run_reports_nothing"]
    assert _all(results) == set()
    assert all(ran_every_due_round(res, 30) for res in results)


@JOB.case(bitwise, "dptp", 5)
def test_dptp_training_is_bitwise_identical_with_scout_on(dptp: CaseResults) -> None:
    results = dptp["test_dptp_training_is_bitwise_identical_with_scout_on"]
    for res in results:
        assert ran_every_due_round(res, 5)
        assert res["verdicts"] == []
        assert res["on"] == res["off"]


# Every recipe on, all intervals 2: hidden layer k at step 2k + 1, the embedding and LM
# head at even steps. The hidden layers' straggler streak is its own.
@pytest.mark.slow  # DDP's runs in CI, and DP x TP's straggler above
@run(
    [
        {
            "rank": 5,
            "step": s,
            "kind": "delay",
            "target": f"layers.{(s - 1) // 2 % 4}",
            "seconds": 0.2,
        }
        for s in (3, 5, 7)
    ],
    9,
    dict.fromkeys(
        ("replay_interval", "embedding_interval", "lm_head_interval", "optimizer_interval"), 2
    ),
)
def test_dptp_compute_straggler_with_the_default_config(dptp: CaseResults) -> None:
    results = dptp["test_dptp_compute_straggler_with_the_default_config"]
    assert {(v[0], v[3], v[4], v[5]) for v in _all(results)} == {
        (5, "straggler", (5,), "rank"),
        (7, "straggler", (5,), "rank"),
    }
