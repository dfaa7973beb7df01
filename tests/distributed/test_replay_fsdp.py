"""Replay on FSDP2: HSDP 3x2 (replica peers along d) and pure FSDP with 4 shard peers.

HSDP gathers each sampled layer's parameters on SCOUT's own shard group (timed as
``t_gather``) and compares across the 3 replicas; pure FSDP compares the 4 shards of
one replica, which can see corrupted outputs but not a corrupted shard (every peer
gathers the same one).
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing import ran_every_due_round
from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


def _run(
    setup: str,
    world: int,
    faults: list[dict[str, Any]],
    steps: int,
    cfg: dict[str, Any] | None = None,
) -> list[Any]:
    from replay_scenarios import scenario

    return run_ranks(
        scenario, world, args=(setup, faults, steps, cfg or {}), timeout_s=200, env=ENV
    )


def _all(results: list[Any]) -> set[tuple[Any, ...]]:
    """Distinct verdicts over all ranks (each replica group judges its own round)."""
    return {
        (v["step"], v["surface"], v["status"], v["failure"], tuple(v["outliers"]), v["scope"])
        for res in results
        for v in res["verdicts"]
    }


@pytest.mark.slow  # the DDP and pure-FSDP output faults run in CI
@pytest.mark.timeout(250)
def test_hsdp_output_bitflip_names_the_rank() -> None:
    faults = [{"rank": 2, "step": 2, "kind": "output", "target": "layers.2", "how": ["bitflip", 0]}]
    results = _run("hsdp", 6, faults, steps=4, cfg={"recipes": ["hidden"]})
    assert _all(results) == {(2, "layer/layers.2/forward", "attributed", "sdc", (2,), "rank")}
    assert results[1]["verdicts"] == []  # the other replica group saw nothing


@pytest.mark.timeout(250)
def test_hsdp_parameter_sdc_names_only_the_owner() -> None:
    faults = [
        {
            "rank": 3,
            "step": 4,
            "kind": "param",
            "target": "layers.1.fc1.weight",
            "how": ["bitflip", 0, 3],
        }
    ]
    results = _run("hsdp", 6, faults, steps=6, cfg={"recipes": ["hidden"]})
    verdicts = _all(results)
    sdc = {v for v in verdicts if v[3] == "sdc"}
    assert sdc, "the corrupted shard was never reported"
    assert all(v[4] == (3,) for v in sdc)
    assert ("layer/layers.1/shard") in {v[1] for v in sdc}
    assert min(v[0] for v in sdc) == 5  # layer 1 is sampled at step 5
    # The shard partner's group (0, 2, 4) gathers the corrupted shard too, but names nobody.
    assert all(v[2] == "inconclusive" and v[4] == () for v in verdicts - sdc)


@pytest.mark.timeout(250)
def test_hsdp_compute_straggler() -> None:
    faults = [
        {"rank": 4, "step": s, "kind": "delay", "target": f"layers.{s % 4}", "seconds": 0.2}
        for s in (2, 3, 4)
    ]
    results = _run("hsdp", 6, faults, steps=6, cfg={"recipes": ["hidden"]})
    assert {(v[0], v[3], v[4]) for v in _all(results)} == {
        (3, "straggler", (4,)),
        (4, "straggler", (4,)),
    }


@pytest.mark.timeout(250)
def test_hsdp_collective_delay_is_group_scoped() -> None:
    faults = [
        {"rank": 2, "step": s, "kind": "collective", "group": "shard", "seconds": 0.4}
        for s in (2, 3, 4)
    ]
    results = _run("hsdp", 6, faults, steps=6, cfg={"recipes": ["hidden"]})
    verdicts = _all(results)
    assert verdicts
    assert {v[3] for v in verdicts} == {"comm_straggler"}
    assert {(v[4], v[5]) for v in verdicts} == {((2, 3), "group")}
    assert min(v[0] for v in verdicts) == 3


@pytest.mark.timeout(300)
def test_hsdp_clean_run_reports_nothing() -> None:
    results = _run("hsdp", 6, [], steps=30)
    assert _all(results) == set()
    assert all(ran_every_due_round(r, 30) for r in results)


@pytest.mark.timeout(250)
def test_hsdp_training_is_bitwise_identical_with_scout_on() -> None:
    from replay_scenarios import bitwise

    results = run_ranks(bitwise, 6, args=("hsdp", 5), timeout_s=200, env=ENV)
    for res in results:
        assert res["verdicts"] == []
        assert res["on"] == res["off"]


@pytest.mark.timeout(250)
def test_hsdp_optimizer_state_corruption_on_the_optimizer_surface() -> None:
    # HSDP optimizer state is sharded, but each shard is replicated across the 3
    # replica peers: the slice of local shards is compared between them.
    faults = [
        {
            "rank": 3,
            "step": 2,
            "kind": "optim",
            "target": "layers.0.fc1.weight",
            "key": "exp_avg",
            "how": ["scale", 3.0],
        }
    ]
    results = _run("hsdp", 6, faults, steps=4, cfg={"recipes": ["optimizer"]})
    assert results[3]["fired"] == [["optim", "layers.0.fc1.weight", 2]]
    verdicts = _all(results)
    assert verdicts
    assert all(v[3] == "sdc" and v[4] == (3,) and v[5] == "rank" for v in verdicts)
    assert (2, "optimizer/result", "attributed", "sdc", (3,), "rank") in verdicts


@pytest.mark.slow  # DDP's runs in CI
@pytest.mark.timeout(250)
def test_hsdp_skipped_capture_is_inconclusive_and_training_goes_on() -> None:
    faults = [{"rank": 4, "step": 2, "kind": "skip"}]
    results = _run("hsdp", 6, faults, steps=4, cfg={"recipes": ["hidden"]})
    assert _all(results) == {
        (2, "layer/layers.2/ready", "inconclusive", None, (), "group"),
    }
    assert all(ran_every_due_round(res, 4) for res in results)  # none hung


@pytest.mark.timeout(250)
def test_two_rank_groups_name_a_refereed_computation_and_nothing_else() -> None:
    # HSDP 2x2 (rank = 2 r + s): replica groups (0, 2) and (1, 3) have two peers, whose
    # vote can see that they disagree but not who is right. Where the pair's inputs and
    # parameters agree and a computed surface differs, a referee settles it: the member
    # of the other replica group at the source's position, which replays the same
    # gathered layer (docs/replay.md, Referee replay). Differing parameters are never
    # refereed and stay group scope.
    faults = [
        {"rank": 2, "step": 1, "kind": "output", "target": "layers.1", "how": ["bitflip", 0]},
        {
            "rank": 3,
            "step": 2,
            "kind": "param",
            "target": "layers.3.fc2.weight",
            "how": ["bitflip", 0, 1],
        },
    ] + [
        {"rank": 1, "step": s, "kind": "delay", "target": f"layers.{s % 4}", "seconds": 0.2}
        for s in (4, 5, 6)
    ]
    results = _run("hsdp", 4, faults, steps=8, cfg={"recipes": ["hidden"]})
    verdicts = _all(results)
    assert verdicts
    # The corrupted output (rank 2, step 1): pair (0, 2) agrees on its inputs and
    # parameters, rank 2 is the source at step 1 (the source rotates with the step), so
    # rank 3 referees, matches rank 0 and rank 2 is named.
    assert (1, "layer/layers.1/forward", "attributed", "sdc", (2,), "rank") in verdicts
    records = [v for res in results for v in res["verdicts"]]
    refereed = [v for v in records if "referee" in v["detail"]]
    reporters = {r["rank"] for r in results for v in r["verdicts"] if "referee" in v["detail"]}
    assert reporters == {0, 2}, refereed  # both members of the pair, and no other rank
    for v in refereed:
        assert (v["step"], v["group"], v["outliers"], v["scope"]) == (1, [0, 2], [2], "rank"), v
        assert (v["detail"]["referee"], v["detail"]["healthy"]) == (3, 0), v
        sigs = v["detail"]["signatures"]
        assert sigs["3"] == sigs["0"] != sigs["2"], v
    # Every other value record names nobody: two copies and no referee's say.
    values = [v for v in records if v["failure"] != "straggler" and "referee" not in v["detail"]]
    assert values
    for v in values:
        assert (v["outliers"], v["scope"], v["status"]) == ([], "group", "inconclusive"), v
    # The corrupted shard (rank 3, step 2) shows when layer 3 is replayed at step 3: the
    # parameters differ, which a recomputation cannot settle.
    assert (3, "layer/layers.3/shard", "inconclusive", "sdc", (), "group") in verdicts
    # Timing needs equal work, not equal values: the replayed block's timing pool is all
    # four ranks (replica and shard partners), so a straggler record, where the delay
    # trips one, names the delayed rank and no other (docs/replay.md, timing pools).
    timing = [v for v in verdicts if v[3] == "straggler"]
    assert all(v[4] == (1,) and v[5] == "rank" for v in timing), timing


@pytest.mark.timeout(250)
def test_fsdp_output_corruption_names_the_rank() -> None:
    faults = [{"rank": 1, "step": 2, "kind": "output", "target": "layers.2", "how": ["bitflip", 0]}]
    results = _run("fsdp", 4, faults, steps=4)
    assert _all(results) == {(2, "layer/layers.2/forward", "attributed", "sdc", (1,), "rank")}


@pytest.mark.timeout(300)
def test_fsdp_clean_run_reports_nothing() -> None:
    results = _run("fsdp", 4, [], steps=30)
    assert _all(results) == set()


@pytest.mark.slow  # DDP's runs in CI, and HSDP's straggler above
@pytest.mark.timeout(250)
def test_hsdp_compute_straggler_with_the_default_config() -> None:
    faults = [
        {
            "rank": 4,
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
    results = _run("hsdp", 6, faults, steps=9, cfg=cfg)
    assert {(v[0], v[3], v[4]) for v in _all(results)} == {
        (5, "straggler", (4,)),
        (7, "straggler", (4,)),
    }
