"""SCOUT on Ulysses sequence parallel and MoE expert parallel DeepSpeed engines (Gloo, CPU).

Both layouts use 6 ranks so that replica peer groups have three members (rank
attribution needs three):

* Ulysses SP=2 x DP=3: sequence groups ``[0,1] [2,3] [4,5]``, replica peers
  ``[0,2,4]`` (sequence slice 0) and ``[1,3,5]`` (slice 1);
* MoE ep_size=2 x DP=3: expert-parallel groups ``[0,1] [2,3] [4,5]``, replica peers
  = expert-data-parallel groups ``[0,2,4]`` (expert 0) and ``[1,3,5]`` (expert 1).

Replaying a block runs its all-to-alls on SCOUT's Gloo copies of the sequence /
expert groups. A persistent low-bit flip of one block's output on one rank is
named on that rank only; clean runs report nothing, and training is bitwise the
same with the ``"scout"`` section on and off.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


def _verdicts(results: list[Any], group: list[int]) -> list[tuple[Any, ...]]:
    """The verdicts of one replica group, checked to be the same on each member."""
    members = [r for r in results if r["peers"] == group]
    assert [r["rank"] for r in members] == group
    keyed = [
        [(v["step"], v["surface"], v["failure"], v["outliers"], v["scope"]) for v in r["verdicts"]]
        for r in members
    ]
    assert all(k == keyed[0] for k in keyed)
    assert all(v["group"] == group for r in members for v in r["verdicts"])
    return keyed[0]


@pytest.mark.timeout(120)
def test_ulysses_sdc_is_named_within_its_sequence_slice() -> None:
    from ds_parallel_scenarios import parallel_scenario

    faults = [{"rank": 3, "target": "layers.0", "bit": 0}]
    results = run_ranks(
        parallel_scenario, 6, args=("ulysses", 2, 1, faults, 4), timeout_s=100, env=ENV
    )
    for res in results:
        rank = res["rank"]
        assert res["address"] == [rank // 2, 0, 0, 0, rank % 2, 0]  # (d, s, t, p, c, e)
        assert res["repointed"] == {
            "DistributedAttention.spg": [rank - rank % 2, rank - rank % 2 + 1]
        }
        assert "seq_parallel" in res["groups"] and "seq_data_parallel" in res["groups"]
        assert res["layers"] == ["layers.0", "layers.1"]
        assert res["rounds"] == res["ready"] == 4
    assert _verdicts(results, [0, 2, 4]) == []
    # Two blocks: layers.0 is replayed at steps 0 and 2.
    assert _verdicts(results, [1, 3, 5]) == [
        (s, "layer/layers.0/forward", "sdc", [3], "rank") for s in (0, 2)
    ]


@pytest.mark.timeout(120)
def test_ulysses_missed_capture_makes_partner_groups_inconclusive_without_a_hang() -> None:
    """Rank 2 never captures: its replica group [0,2,4] is not ready, so its sequence
    partners' group [1,3,5] must not enter the diagnostic all-to-all either."""
    from ds_parallel_scenarios import parallel_scenario

    faults = [{"rank": 2, "skip_capture": True}]
    results = run_ranks(
        parallel_scenario, 6, args=("ulysses", 2, 1, faults, 2), timeout_s=100, env=ENV
    )
    for res in results:
        assert res["rounds"] == 2 and res["ready"] == 0, res["reasons"]
        reasons = {reason for _, _, _, reason in res["reasons"]}
        if res["rank"] % 2 == 0:
            assert reasons == {"capture missing on some peer"}, reasons
        else:
            assert reasons == {"a gather partner's replica group is not ready"}, reasons
    for group in ([0, 2, 4], [1, 3, 5]):
        assert all(v[2] is None for v in _verdicts(results, group))


@pytest.mark.timeout(120)
def test_moe_sdc_is_named_within_its_expert_data_parallel_group() -> None:
    from ds_parallel_scenarios import parallel_scenario

    faults = [{"rank": 4, "target": "layers.1", "bit": 0}]
    results = run_ranks(parallel_scenario, 6, args=("moe", 2, 1, faults, 4), timeout_s=100, env=ENV)
    for res in results:
        rank = res["rank"]
        assert res["address"] == [rank // 2, 0, 0, 0, 0, rank % 2]  # (d, s, t, p, c, e)
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        assert res["repointed"] == {"MOELayer.ep_group": pair, "TopKGate.ep_group": pair}
        assert {"expert_parallel", "expert_data_parallel"} <= set(res["groups"])
        # Dense and expert parameter groups: still one replay boundary per step.
        assert res["rounds"] == res["ready"] == 4
    assert _verdicts(results, [1, 3, 5]) == []
    assert _verdicts(results, [0, 2, 4]) == [
        (s, "layer/layers.1/forward", "sdc", [4], "rank") for s in (1, 3)
    ]


@pytest.mark.timeout(120)
def test_autotp_layout_is_deepspeeds_own_groups() -> None:
    """DeepSpeed's AutoTP training (``tensor_parallel.autotp_size = 2``) on 4 Gloo ranks,
    DP 2 x TP 2: the layout the plugin derives from the real engine has DeepSpeed's own
    tensor- and data-parallel groups (``deepspeed.utils.groups``), and its check agrees."""
    from ds_parallel_scenarios import TP_HIDDEN, autotp_layout

    results = run_ranks(autotp_layout, 4, args=(2,), timeout_s=100, env=ENV)
    for res in results:
        rank = res["rank"]
        # AutoTP really sharded the model: up column-parallel, down row-parallel.
        assert res["shapes"]["blocks.0.up.weight"][0] == TP_HIDDEN // 2
        assert res["shapes"]["blocks.0.down.weight"][1] == TP_HIDDEN // 2
        assert (res["mp_world_size"], res["dp_world_size"]) == (2, 2)
        # DeepSpeed's (data_parallel, tensor_parallel) mesh: TP ranks contiguous, DP strided.
        assert res["ds_tp_group"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert res["ds_dp_group"] == [rank % 2, rank % 2 + 2]
        assert res["sizes"] == {"d": 2, "s": 1, "t": 2, "p": 1, "c": 1, "e": 1}
        assert res["layout_tp_group"] == res["ds_tp_group"]
        assert res["layout_peers"] == res["ds_dp_group"]  # peers share a TP coordinate
        assert res["check"] is None
        assert res["wrong_world"] is not None and "but the job has 8" in res["wrong_world"]
    # The TP partners trained on one batch, the two data-parallel replicas on two.
    losses = [res["loss"] for res in results]
    assert losses[0] == losses[1] and losses[2] == losses[3] and losses[0] != losses[2]


@pytest.mark.timeout(150)
# Under ``-m slow``: in CI the SDC tests above check that the other replica group stays
# silent, and test_deepspeed_replay.py's ZeRO-3 clean run checks bitwise identity.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ulysses", "moe"])
def test_clean_parallel_run_is_silent_and_bitwise_identical(kind: str) -> None:
    from ds_parallel_scenarios import bitwise_on_off

    results = run_ranks(bitwise_on_off, 6, args=(kind, 2, 1, 8), timeout_s=130, env=ENV)
    for res in results:
        assert res["on_attached"] and not res["off_attached"]
        assert res["verdicts"] == []
        # 8 hidden-layer rounds, plus embedding and LM head at steps 0 and 4; the MoE
        # model also gets one router round and one all-to-all round (router_interval and
        # all_to_all_interval 20, spread into the first 8 steps). Its experts are not
        # replayed: no moe_catalog.
        assert res["rounds"] == res["ready"] == (14 if kind == "moe" else 12)
        assert res["on"] == res["off"]
        assert res["on_losses"] == res["off_losses"]
    # Dense + expert weights: identical within each expert-data-parallel group.
    by_rank = {r["rank"]: r["on"]["params"] for r in results}
    assert by_rank[0] == by_rank[2] == by_rank[4]
    assert by_rank[1] == by_rank[3] == by_rank[5]
