"""The wait-for graph names the root of a stall where no vote can: pairs and single copies.

Each case runs the real pipeline an observer runs on the round's evidence
(``decide_round`` per peer group, ``resolve``, ``merge``), with the positions a frozen
rank and its waiters publish under DDP x 2, HSDP 2 x 2, DP 2 x TP 2 and PP 2 x DP 2.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scout_core.observer.fingerprint import COLLECTIVES
from scout_core.observer.progress import Stage
from scout_core.observer.resolve import GroupResult, merge, resolve
from scout_core.observer.roles import GroupRoles, collective_members, plain_group_word
from scout_core.observer.verdict import RankEvidence, Verdict, decide_round
from scout_core.observer.waitfor import Position, WaitForGraph
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure, Scope, Status

NONE = (0, 0, 0)
QUIET = 4.0


def _coll(layout: MeshLayout | None, rank: int, ranks: Sequence[int], name: str = "all_reduce"):
    word = GroupRoles(layout, rank).group_word(ranks) if layout else plain_group_word(ranks)
    return (COLLECTIVES[name].code << 48 | 1 << 40, word, 77)


def _in(layout: MeshLayout | None, rank: int, step: int, op: int, ranks: Sequence[int]):
    return RankEvidence(rank, step, op, int(Stage.COLLECTIVE), _coll(layout, rank, ranks), QUIET)


def _at(rank: int, step: int, op: int, stage: Stage) -> RankEvidence:
    return RankEvidence(rank, step, op, int(stage), NONE, QUIET)


def _round(
    layout: MeshLayout | None, groups: Sequence[Sequence[int]], evidence: Sequence[RankEvidence]
) -> list[tuple[Verdict, int]]:
    table = {e.rank: e for e in evidence}
    job = sorted(table)

    def members_of(e: RankEvidence) -> tuple[int, ...] | None:
        if e.stage != Stage.COLLECTIVE:
            return None
        if layout is None:
            return tuple(job)
        return collective_members(layout, e.rank, e.fingerprint[1], e.peer)

    results: list[GroupResult] = []
    for group in groups:
        ev = [table[r] for r in group]
        verdicts = decide_round(ev, min_quiet_s=2.0, world_size=len(job))
        results.append(
            resolve(
                group,
                min(group),
                ev,
                verdicts,
                history={},
                members_of=members_of,
                lookup=table.get,
                min_quiet_s=2.0,
            )
        )
    return merge(results, job=job, layout=layout)


def _named(decided: Sequence[tuple[Verdict, int]]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(v.failure.value, v.status.value, v.outliers) for v, _ in decided]


DDP2 = MeshLayout.from_order("dp", dp=2)


@pytest.mark.parametrize("stage", [Stage.IDLE, Stage.DATALOADER, Stage.CHECKPOINT_WRITE])
@pytest.mark.parametrize("victim", [0, 1])
def test_ddp_pair_names_the_rank_its_partner_waits_for(victim: int, stage: Stage) -> None:
    other = 1 - victim
    evidence = [_at(victim, 3, 30, stage), _in(DDP2, other, 3, 31, (0, 1))]
    decided = _round(DDP2, [(0, 1)], evidence)
    kind = {Stage.IDLE: "hang", Stage.DATALOADER: "input_stall"}.get(stage, "checkpoint_stall")
    assert _named(decided) == [(kind, "attributed", (victim,))]
    v = decided[0][0]
    assert v.scope is Scope.RANK and v.group == (0, 1)
    assert v.detail["waiting"][str(other)]["for"] == [victim]
    assert v.detail["waiting"][str(other)]["pending"]["collective"] == "all_reduce"
    assert f"rank {other} waits for it in all_reduce over d" in v.detail["reason"]


def test_ddp_pair_with_the_reducer_unseen_names_the_rank_behind() -> None:
    """DDP's all-reduce runs in C++: the waiter's last stage is ``layer``, ahead of the
    frozen rank's idle position, and the rank behind cannot wait for the one ahead."""
    decided = _round(DDP2, [(0, 1)], [_at(0, 3, 40, Stage.LAYER), _at(1, 3, 30, Stage.IDLE)])
    assert _named(decided) == [("hang", "attributed", (1,))]
    assert decided[0][0].detail["waiting"]["0"]["for"] == [1]


def test_ddp_pair_without_a_layout_reads_the_world_group() -> None:
    evidence = [_in(None, 0, 3, 31, (0, 1)), _at(1, 3, 30, Stage.IDLE)]
    assert _named(_round(None, [(0, 1)], evidence)) == [("hang", "attributed", (1,))]


def test_a_pair_inside_one_collective_is_a_stall_of_it_naming_nobody() -> None:
    evidence = [_in(DDP2, 0, 3, 31, (0, 1)), _in(DDP2, 1, 3, 31, (0, 1))]
    decided = _round(DDP2, [(0, 1)], evidence)
    assert _named(decided) == [("group_stall", "agree", ())]
    assert decided[0][0].scope is Scope.JOB


HSDP = MeshLayout.from_order("s-d", s=2, d=2)  # shard partners (0, 1), replicas (0, 2)


@pytest.mark.parametrize("victim", [0, 1, 2, 3])
def test_hsdp_2x2_names_the_frozen_rank_and_lists_the_other_three_waiting(victim: int) -> None:
    """FSDP2's all-gathers and all-reduces are invisible: every waiter shows ``layer``
    or ``optimizer``. The frozen rank's shard partner waits in its forward, its replica
    peer (further, ahead of it) in the gradient all-reduce."""
    partner = victim ^ 1
    stages = {victim: (30, Stage.IDLE), partner: (31, Stage.LAYER)}
    for r in (victim ^ 2, partner ^ 2):
        stages[r] = (45, Stage.OPTIMIZER)
    evidence = [_at(r, 3, op, st) for r, (op, st) in sorted(stages.items())]
    decided = _round(HSDP, [(0, 2), (1, 3)], evidence)
    assert _named(decided) == [("hang", "attributed", (victim,))]
    waiting = decided[0][0].detail["waiting"]
    assert sorted(waiting) == sorted(str(r) for r in range(4) if r != victim)
    assert all(w["for"] == [victim] for w in waiting.values())


def test_hsdp_partners_both_in_their_forward_are_not_told_apart() -> None:
    """Rank 0 stopped inside its forward, rank 1 waiting in an all-gather SCOUT does not
    see: the same step, both ``layer``. Either may wait for the other: nobody is named."""
    evidence = [
        _at(0, 3, 31, Stage.LAYER),
        _at(1, 3, 31, Stage.LAYER),
        _at(2, 3, 45, Stage.OPTIMIZER),
        _at(3, 3, 45, Stage.OPTIMIZER),
    ]
    decided = _round(HSDP, [(0, 2), (1, 3)], evidence)
    assert [v.localized for v, _ in decided] == [False, False]
    assert all(v.status is Status.INCONCLUSIVE for v, _ in decided)
    assert "ranks [0, 1] may each wait for the other" in decided[0][0].detail["graph"]


DPTP = MeshLayout.from_order("tp-dp", tp=2, dp=2)  # TP pairs (0, 1), (2, 3)


@pytest.mark.parametrize("visible", [True, False])
def test_dp2_tp2_names_the_frozen_rank_not_its_tp_partner(visible: bool) -> None:
    """Rank 2 frozen before its forward. Its TP partner 3 waits in the TP all-reduce
    (seen by the patch, or DTensor's unseen); 0 and 1 wait in their gradient all-reduce."""
    p3 = _in(DPTP, 3, 3, 33, (2, 3)) if visible else _at(3, 3, 33, Stage.LAYER)
    evidence = [
        _in(DPTP, 0, 3, 50, (0, 2)),
        _in(DPTP, 1, 3, 50, (1, 3)),
        _at(2, 3, 30, Stage.IDLE),
        p3,
    ]
    decided = _round(DPTP, [(0, 2), (1, 3)], evidence)
    assert _named(decided) == [("hang", "attributed", (2,))]
    v = decided[0][0]
    assert v.group == (0, 2)
    waiting = v.detail["waiting"]
    assert {r: w["for"] for r, w in waiting.items()} == {"0": [2], "1": [2], "3": [2]}
    assert waiting["1"]["via"] == [3, 2]  # 1 waits for 3 in the DP all-reduce, 3 for 2


PP = MeshLayout.from_order("pp-dp", pp=2, dp=2)  # stages (0, 1) of replica 0, (2, 3) of 1


def test_pipeline_2_stages_x_dp2_names_the_frozen_stage_rank() -> None:
    recv = (COLLECTIVES["recv"].code << 48, GroupRoles(PP, 3).p2p_word(2), 9)
    evidence = [
        _in(PP, 0, 3, 50, (0, 2)),
        _in(PP, 1, 3, 50, (1, 3)),
        _at(2, 3, 30, Stage.IDLE),
        RankEvidence(3, 3, 31, int(Stage.COLLECTIVE), recv, QUIET, peer=2),
    ]
    decided = _round(PP, [(0, 2), (1, 3)], evidence)
    assert _named(decided) == [("hang", "attributed", (2,))]
    waiting = decided[0][0].detail["waiting"]
    assert waiting["3"]["pending"]["group"] == "p2p"
    assert waiting["1"]["via"] == [3, 2]


def test_two_frozen_ranks_of_different_instances_are_both_named() -> None:
    """Ranks 0 and 3 of HSDP 2 x 2 both sit in the DataLoader; the others wait."""
    evidence = [
        _at(0, 3, 30, Stage.DATALOADER),
        _at(1, 3, 31, Stage.LAYER),
        _at(2, 3, 31, Stage.LAYER),
        _at(3, 3, 30, Stage.DATALOADER),
    ]
    decided = _round(HSDP, [(0, 2), (1, 3)], evidence)
    assert _named(decided) == [
        ("input_stall", "attributed", (0,)),
        ("input_stall", "attributed", (3,)),
    ]


def test_a_root_whose_observer_did_not_answer_is_not_named_by_the_graph() -> None:
    """Rank 1 waits in a collective over (0, 1); rank 0's observer never answered."""
    results = [
        GroupResult(
            (0, 1),
            1,
            (
                Verdict(
                    Failure.HANG, "progress", Status.INCONCLUSIVE, (), Scope.GROUP, 3, group=(0, 1)
                ),
            ),
            evidence=(_in(DDP2, 1, 3, 31, (0, 1)),),
        )
    ]
    decided = merge(results, job=[0, 1], layout=DDP2)
    assert _named(decided) == [("hang", "inconclusive", ())]
    assert "rank 0, waited for, did not answer" in decided[0][0].detail["graph"]


def test_graph_components_and_chains() -> None:
    """A cycle of possible waits is one component; only sinks are roots."""
    layout = MeshLayout.from_order("tp-dp", tp=2, dp=1)
    g = WaitForGraph([Position(0, 3, Stage.LAYER), Position(1, 3, Stage.LAYER)], layout, behind=[])
    assert g.component(0) == frozenset({0, 1}) and g.is_sink(0)
    assert g.roots_of([0]) == [frozenset({0, 1})]
    g = WaitForGraph([Position(0, 3, Stage.LAYER), Position(1, 3, Stage.IDLE)], layout)
    assert g.roots_of([0]) == [frozenset({1})] and g.chain(0, 1) == [0, 1]
    assert g.waiters(1) == [0]


# -- protocol mismatch in a pair ------------------------------------------------------------

WORLD4 = MeshLayout.from_order("s-d", s=2, d=2)


def test_a_side_collective_mismatch_is_decided_by_the_members_majority() -> None:
    """Every rank of HSDP 2 x 2 enters a collective over all four; rank 1 broadcasts where
    the other three all-reduce. Its peer group (1, 3) alone cannot say who departs."""
    everyone = (0, 1, 2, 3)
    bcast = (COLLECTIVES["broadcast"].code << 48 | 1, _coll(WORLD4, 1, everyone)[1], 77)
    evidence = [
        _in(WORLD4, 0, 2, 60, everyone),
        RankEvidence(1, 2, 61, int(Stage.COLLECTIVE), bcast, QUIET),
        _in(WORLD4, 2, 2, 60, everyone),
        _in(WORLD4, 3, 2, 61, everyone),
    ]
    decided = _round(WORLD4, [(0, 2), (1, 3)], evidence)
    assert _named(decided) == [("protocol_mismatch", "attributed", (1,))]
    v = decided[0][0]
    assert v.detail["expected"]["1"]["collective"] == "all_reduce"
    assert "the collective's members" in v.detail["reason"]


def _pair_mismatch(template0: object, template1: object) -> list[tuple[Verdict, int]]:
    """DDP x 2: rank 1 entered one extra all-reduce (another shape) where rank 0 entered
    the step's usual one; each rank's template is what it entered there a step before."""
    usual = _coll(DDP2, 0, (0, 1))
    extra = (usual[0], usual[1], 99)
    evidence = [
        RankEvidence(0, 4, 70, int(Stage.COLLECTIVE), usual, QUIET, None, template0),  # type: ignore[arg-type]
        RankEvidence(1, 4, 70, int(Stage.COLLECTIVE), extra, QUIET, None, template1),  # type: ignore[arg-type]
    ]
    return _round(DDP2, [(0, 1)], evidence)


def test_a_pair_mismatch_is_decided_by_the_jobs_template() -> None:
    usual = _coll(DDP2, 0, (0, 1))
    decided = _pair_mismatch(usual, usual)
    assert _named(decided) == [("protocol_mismatch", "attributed", (1,))]
    assert "the job's template" in decided[0][0].detail["reason"]


@pytest.mark.parametrize(
    ("t0", "t1", "why"),
    [
        (None, None, "no template"),
        ("usual", "other", "no agreed template"),
        ("other", "other", "every rank or no rank departs"),
    ],
)
def test_without_an_agreed_template_a_pair_mismatch_names_nobody(
    t0: str, t1: str, why: str
) -> None:
    usual = _coll(DDP2, 0, (0, 1))
    pick = {"usual": usual, "other": (usual[0], usual[1], 5), None: None}
    decided = _pair_mismatch(pick[t0], pick[t1])
    assert _named(decided) == [("protocol_mismatch", "inconclusive", ())]
    assert why in decided[0][0].detail["graph"]


def test_the_record_gives_the_previous_steps_collective_at_the_same_position() -> None:
    from scout_core.observer.progress import RING, ProgressRecord, Publisher

    rec = ProgressRecord.create()
    try:
        pub = Publisher(rec)
        a, b, other = (1 << 48, 5, 1), (1 << 48, 5, 2), (8 << 48, 6, 1)
        for step in range(3):
            pub.set_step(step)
            for fp in (a, other, b):
                pub.enter_collective(fp)
                pub.exit_collective()
        pub.set_step(3)
        pub.enter_collective(a)
        pub.exit_collective()
        pub.enter_collective((1 << 48, 5, 9))  # where step 2 entered b on group 5
        assert rec.template(rec.read()) == b
        pub.exit_collective()
        assert rec.template(rec.read()) is None  # outside a collective
        for _ in range(RING):  # step 3 fills the ring: step 2 is gone from it
            pub.enter_collective(a)
        assert rec.template(rec.read()) is None
    finally:
        rec.close()


def test_a_pair_stuck_together_in_one_collective_is_a_stall_not_a_root() -> None:
    """HSDP 2 x 2: shard partners 0 and 1 sit inside the same all-reduce over their shard
    group, which never completes; 2 and 3 wait for them in the replicas' all-reduce. Each
    vote is a pair with no majority, and 0 and 1 wait for nobody: the collective is stuck,
    so one group stall names its members and no rank is named."""
    evidence = [
        _in(HSDP, 0, 2, 40, (0, 1)),
        _in(HSDP, 1, 2, 40, (0, 1)),
        _in(HSDP, 2, 2, 60, (0, 2)),
        _in(HSDP, 3, 2, 60, (1, 3)),
    ]
    decided = _round(HSDP, [(0, 2), (1, 3)], evidence)
    assert _named(decided) == [("group_stall", "agree", ())]
    v = decided[0][0]
    assert v.detail["stalled"] == [[0, 1]] and v.scope is Scope.GROUP
    assert {r: w["for"] for r, w in v.detail["waiting"].items()} == {"2": [0], "3": [1]}


PP2DP3 = MeshLayout.from_order("pp-dp", pp=2, dp=3)  # stage 0: 0, 2, 4; stage 1: 1, 3, 5


@pytest.mark.parametrize("stage1_quiet", [QUIET, 0.5])
def test_a_waiter_of_another_group_is_listed_before_its_own_group_votes(
    stage1_quiet: float,
) -> None:
    """PP 2 x DP 3, rank 2 (stage 0) frozen: 0 and 4 wait for it in their all-reduce, its
    stage-1 partner 3 waits for it in ``recv``, 1 and 5 wait for 3. Stage 0's vote names 2.
    Whether or not stage 1's vote has run yet (1 and 5 quiet for less than ``min_quiet_s``
    when stage 0 decides), rank 3 is listed as waiting for 2, and nobody of stage 1 is named."""
    recv = (COLLECTIVES["recv"].code << 48, GroupRoles(PP2DP3, 3).p2p_word(2), 9)
    stage1 = (1, 3, 5)
    evidence = [
        _in(PP2DP3, 0, 3, 50, (0, 2, 4)),
        _at(2, 3, 30, Stage.IDLE),
        _in(PP2DP3, 4, 3, 50, (0, 2, 4)),
        RankEvidence(1, 3, 60, int(Stage.COLLECTIVE), _coll(PP2DP3, 1, stage1), stage1_quiet),
        RankEvidence(3, 3, 31, int(Stage.COLLECTIVE), recv, QUIET, peer=2),
        RankEvidence(5, 3, 60, int(Stage.COLLECTIVE), _coll(PP2DP3, 5, stage1), stage1_quiet),
    ]
    decided = _round(PP2DP3, [(0, 2, 4), stage1], evidence)
    assert _named(decided) == [("hang", "attributed", (2,))]
    waiting = decided[0][0].detail["waiting"]
    assert sorted(waiting) == ["3"]
    assert waiting["3"]["for"] == [2]
    assert waiting["3"]["pending"]["group"] == "p2p"
