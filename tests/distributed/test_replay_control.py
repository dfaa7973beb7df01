"""Replay under unusual control flow, in real multi-rank jobs (Gloo, CPU).

* Instance-level ``forward`` overrides (issue 10 item 2): on DDP a slow wrapper is a
  straggler and nothing else; under DP x TP the overridden layers are named at
  ``enable``, read inconclusive, and the job finishes.
* Asymmetric steps (issue 16 item 11): an extra ``optimizer.step()`` or a missing
  micro-batch on one rank is a control-flow divergence naming it, never a deadlock.
* Collective counts (issue 15): one replay round, and a step where nothing is due.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing import ran_every_due_round
from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
EVERY_STEP = {
    "replay_interval": 1,
    "embedding_interval": 1,
    "lm_head_interval": 1,
    "optimizer_interval": 1,
}
EVERY_OTHER_STEP = dict.fromkeys(EVERY_STEP, 2)


def _verdicts(results: list[Any]) -> set[tuple[Any, ...]]:
    return {
        (v["step"], v["surface"], v["status"], v["failure"], tuple(v["outliers"]), v["scope"])
        for res in results
        for v in res["verdicts"]
    }


@pytest.mark.timeout(300)
def test_ddp_slow_instance_forward_is_a_straggler_only() -> None:
    # Issue 10 item 2's reproduction: after enable, rank 2 wraps every block's forward
    # in a 150 ms sleep. Replay runs the wrapper on the live module with the replay
    # parameters bound, so rank 2 is slow and computes exactly what its peers do.
    from control_scenarios import override

    results = run_ranks(
        override,
        5,
        args=("ddp", 2, "slow", False, 6),
        kwargs={"cfg": EVERY_STEP},
        timeout_s=250,
        env=ENV,
    )
    verdicts = _verdicts(results)
    assert verdicts, "the slow wrapper was not seen"
    assert {(v[3], v[4], v[5]) for v in verdicts} == {("straggler", (2,), "rank")}
    assert all(v[1].startswith("layer/layers.") and v[1].endswith("/t_M") for v in verdicts)
    assert min(v[0] for v in verdicts) == 1  # two consecutive hidden rounds: steps 0 and 1
    assert results[2]["overrides"] == {f"layers.{i}": None for i in range(4)}


@pytest.mark.timeout(300)
def test_dptp_forward_override_finishes_and_blames_nobody_else() -> None:
    # DP x TP 3x2: rank 3 adds 1e-3 to every block's output through an instance-level
    # forward, installed before enable. Running it from replay would reach the training
    # TP group; SCOUT names the layers at enable and reads their rounds inconclusive.
    from control_scenarios import override

    results = run_ranks(
        override,
        6,
        args=("dptp", 3, "add", True, 4),
        kwargs={"cfg": EVERY_STEP},
        timeout_s=250,
        env=ENV,
    )
    assert all(ran_every_due_round(res, 4) for res in results)  # none hung
    named = results[3]["overrides"]
    assert set(named) == {f"layers.{i}" for i in range(4)}
    assert all("tensor parallelism" in str(why) for why in named.values())
    said = [line for line in results[3]["logs"] if "instance-level forward" in line]
    assert len(said) == 1 and all(f"layers.{i}" in said[0] for i in range(4))
    verdicts = _verdicts(results)
    assert all(v[4] in ((), (3,)) for v in verdicts), verdicts  # nobody else is named
    gaps = {v for v in verdicts if v[1].endswith("/gap")}
    assert {v[1] for v in gaps} == {f"layer/layers.{i}/gap" for i in range(4)}
    assert all(v[2] == "inconclusive" and v[3] is None and v[5] == "group" for v in gaps)
    detail = next(
        v["detail"] for res in results for v in res["verdicts"] if v["surface"].endswith("/gap")
    )
    assert "3" in detail["missing"] and "training collective" in detail["missing"]["3"]


@pytest.mark.timeout(300)
def test_extra_optimizer_step_is_a_divergence_not_a_deadlock() -> None:
    # Rank 2 takes one extra optimizer.step() at step 3 (no forward in between). Counting
    # optimizer steps it would be one iteration ahead and enter replay collectives its
    # peers never join; the clock sees no training forward, stays, and the readiness of
    # the next round (step 4) reports the extra step before any payload collective.
    from control_scenarios import asymmetric

    results = run_ranks(
        asymmetric, 4, args=("step", 2, 3, 8, EVERY_OTHER_STEP), timeout_s=200, env=ENV
    )
    assert [res["clock"] for res in results] == [8] * 4
    verdicts = _verdicts(results)
    split = {v for v in verdicts if v[3] == "protocol_mismatch"}
    assert split and min(v[0] for v in split) == 4
    assert {(v[1].rsplit("/", 1)[-1], v[2], v[4], v[5]) for v in split} == {
        ("steps", "attributed", (2,), "rank")
    }
    # Its extra update makes rank 2's state differ from then on: named, nobody else.
    assert all(v[4] == (2,) for v in verdicts)
    first = next(v for res in results for v in res["verdicts"] if v["surface"].endswith("/steps"))
    assert first["detail"]["counts"] == {"0": 0, "1": 0, "2": 1, "3": 0}


@pytest.mark.timeout(300)
def test_fewer_micro_batches_are_a_divergence() -> None:
    from control_scenarios import asymmetric

    results = run_ranks(
        asymmetric, 4, args=("micro", 1, 2, 5, EVERY_OTHER_STEP), timeout_s=200, env=ENV
    )
    verdicts = _verdicts(results)
    assert verdicts
    assert {(v[0], v[2], v[3], v[4], v[5]) for v in verdicts} == {
        (2, "attributed", "protocol_mismatch", (1,), "rank")
    }
    assert {v[1] for v in verdicts} == {"layer/embed/micro", "layer/head/micro"}


@pytest.mark.timeout(300)
def test_collectives_of_one_round_and_of_an_idle_step() -> None:
    # Default cadence (every recipe every 20 steps, spread: optimizer at 4, LM head at 9,
    # embedding at 14, a hidden layer at 19). A due step runs one recipe: readiness,
    # payload broadcast and result exchange on the peer group, plus one job-wide
    # reduction (the boundary vote, a gather of a few words per rank) carrying both the
    # checkpoint gate's flags and the incident merger's "any records?" word. The healthy
    # optimizer round runs one exchange: each peer replays its own slice, and readiness,
    # the slices' signatures, the update and the result travel together; it broadcasts
    # nothing. A step where nothing is due runs no collective and carries no capture hook.
    from control_scenarios import count_collectives

    (res, *_) = run_ranks(count_collectives, 4, args=(25, {}), timeout_s=200, env=ENV)
    assert res["verdicts"] == []
    due = {s: kinds for s, kinds in enumerate(res["due"]) if kinds}
    assert due == {
        4: ["optimizer"],
        9: ["lm_head"],
        14: ["embedding"],
        19: ["hidden"],
        24: ["optimizer"],
    }
    round_calls = [
        "all_gather_single",
        "broadcast",
        "all_gather_single",
        "all_gather_single",  # the vote
    ]
    optimizer_calls = ["all_gather_single", "all_gather_single"]  # the exchange, the vote
    for step, calls in enumerate(res["calls"]):
        want = round_calls if step in due else []
        if due.get(step) == ["optimizer"]:
            want = optimizer_calls
        assert calls == want, (step, calls)
    # Capture hooks exist only during an iteration whose layer recipe is due.
    hooked = {s + 1: paths for s, paths in enumerate(res["hooked"]) if paths}
    assert hooked == {9: ["head"], 14: ["embed"], 19: ["layers.0"]}
    assert res["hooked"][-1] == []


@pytest.mark.timeout(300)
def test_a_timing_pool_wider_than_the_peer_group_adds_one_all_gather_per_round() -> None:
    # DP 2 x TP 2: the peer groups are (0, 2) and (1, 3), and the four ranks replay equal
    # work (replay gathers the TP block), so each layer round's t_M is judged over a pool
    # of four: one all-gather of the work keys and t_M on SCOUT's pool group, after the
    # result exchange. Under DDP (the test above) the pool is the peer group: no extra
    # collective. The optimizer round is not pooled. Referee replay adds nothing to a
    # healthy round: its request rides the pool's all-gather, and its point-to-point
    # calls (isend / irecv, counted here too) run only on a disagreement.
    from control_scenarios import count_collectives

    results = run_ranks(count_collectives, 4, args=(25, {}, None, "dptp"), timeout_s=250, env=ENV)
    res = results[0]
    assert all(r["calls"] == res["calls"] for r in results)
    assert res["verdicts"] == []
    due = {s: kinds for s, kinds in enumerate(res["due"]) if kinds}
    assert due == {4: ["optimizer"], 9: ["lm_head"], 14: ["embedding"], 19: ["hidden"]} | {
        24: ["optimizer"]
    }
    layer_round = [
        "all_gather_single",  # readiness on the peer group
        "all_gather_single",  # readiness AND over SCOUT's TP group
        "broadcast",
        "all_gather_single",  # the result exchange on the peer group
        "all_gather_single",  # the timing pool: work keys, t_M and referee flags
        "all_gather_single",  # the vote
    ]
    gathers = ["all_gather_single"] * 3  # the hidden block's TP shards (fc1 w, b; fc2 w)
    hidden_round = layer_round[:3] + gathers + layer_round[3:]
    want = {4: ["all_gather_single"] * 2, 9: layer_round, 14: layer_round, 19: hidden_round}
    want[24] = want[4]
    for step, calls in enumerate(res["calls"]):
        assert calls == want.get(step, []), (step, calls)


@pytest.mark.timeout(200)
def test_optimizer_round_broadcasts_only_when_the_peers_slices_differ() -> None:
    # Rank 2's optimizer adds 1e-3 to every parameter from step 3 on. At step 3 every
    # peer's pre-step slice still agrees, so no slice is broadcast and each peer
    # replays its own: the replayed update names rank 2 as the real result does. From
    # step 4 rank 2's state differs, and the source's slice is broadcast.
    from control_scenarios import count_collectives

    cfg = {"recipes": ["optimizer"], "optimizer_interval": 1}
    results = run_ranks(count_collectives, 4, args=(6, cfg, (2, 3)), timeout_s=150, env=ENV)
    res = results[0]
    assert all(r["calls"] == res["calls"] for r in results)
    # A healthy round: one exchange and the vote; where the slices differ, the
    # broadcast and a second exchange come between.
    healthy = ["all_gather_single"] * 2
    differ = ["all_gather_single", "broadcast", "all_gather_single", "all_gather_single"]
    # (Steps with verdicts add the incident merger's merge, all_gathers of record bytes.)
    rounds = [[c for c in calls if c != "all_gather"] for calls in res["calls"]]
    assert rounds == [healthy] * 4 + [differ] * 2, res["calls"]
    seen = {(v["step"], v["surface"]): v for v in res["verdicts"]}
    assert {s for s, _ in seen} == {3, 4, 5}
    assert all(v["failure"] == "sdc" and v["outliers"] == [2] for v in seen.values())
    assert {surface for step, surface in seen if step == 3} == {
        "optimizer/update",
        "optimizer/result",
    }
    assert (4, "optimizer/slice") in seen
