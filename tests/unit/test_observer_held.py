"""A rank held up by a hung rank of its own model instance is recorded as waiting, not named.

DP 3 x TP 2 (``tp-dp``): TP pairs (0, 1), (2, 3), (4, 5), peer groups (0, 2, 4) and
(1, 3, 5). Rank 4 is frozen before its forward (idle); its TP partner 5 waits inside a
TP collective SCOUT's patch does not see (TorchTitan's DTensor redistribution), so its
last published stage is ``layer`` and nothing names the members it waits for. Each
peer group names its rank behind (the real observer's pipeline: ``decide_round``,
``resolve``, ``merge``); the merge must keep rank 4 named and record 5 as waiting.
"""

from __future__ import annotations

from collections.abc import Sequence

from scout_core.observer.fingerprint import COLLECTIVES
from scout_core.observer.progress import Stage
from scout_core.observer.resolve import GroupResult, merge, resolve
from scout_core.observer.roles import GroupRoles
from scout_core.observer.roots import release_held
from scout_core.observer.verdict import RankEvidence, Verdict, decide_round
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure, Scope, Status

LAYOUT = MeshLayout.from_order("tp-dp", tp=2, dp=3)
NONE = (0, 0, 0)


def _dp_all_reduce(rank: int) -> tuple[int, int, int]:
    """The fingerprint of the gradient all-reduce over ``rank``'s replica group."""
    word = GroupRoles(LAYOUT, rank).group_word(LAYOUT.replica_group(rank))
    return (COLLECTIVES["all_reduce"].code << 48 | 1 << 40, word, 77)


def _waiting_in_dp(rank: int, step: int = 3) -> RankEvidence:
    return RankEvidence(rank, step, 260, int(Stage.COLLECTIVE), _dp_all_reduce(rank), 3.9)


def _group(ranks: Sequence[int], evidence: Sequence[RankEvidence]) -> GroupResult:
    verdicts = decide_round(evidence, min_quiet_s=2.0, world_size=6)
    table = {e.rank: e for e in evidence}
    return resolve(
        ranks,
        min(ranks),
        evidence,
        verdicts,
        history={},
        members_of=lambda e: LAYOUT.group_along(e.rank, ("d",)),
        lookup=table.get,
        min_quiet_s=2.0,
    )


def _round(stage4: Stage, step4: int, stage5: Stage, step5: int) -> list[GroupResult]:
    g0 = _group(
        (0, 2, 4),
        [
            _waiting_in_dp(0),
            _waiting_in_dp(2),
            RankEvidence(4, step4, 251, int(stage4), NONE, 4.0),
        ],
    )
    g1 = _group(
        (1, 3, 5),
        [
            _waiting_in_dp(1),
            _waiting_in_dp(3),
            RankEvidence(5, step5, 252, int(stage5), NONE, 4.0),
        ],
    )
    return [g0, g1]


def _named(decided: Sequence[tuple[Verdict, int]]) -> list[tuple[tuple[int, ...], str]]:
    return [(v.outliers, v.failure.value) for v, _ in decided]


def test_the_tp_partner_in_an_unseen_collective_waits_for_the_frozen_rank() -> None:
    results = _round(Stage.IDLE, 3, Stage.LAYER, 3)
    assert [v.outliers for r in results for v in r.verdicts] == [(4,), (5,)]  # both behind
    decided = merge(results, job=range(6), layout=LAYOUT)
    assert _named(decided) == [((4,), "hang")]
    (v, writer) = decided[0]
    assert writer == 0 and v.group == (0, 2, 4) and v.status is Status.ATTRIBUTED
    assert v.detail["waiting"] == {"5": {"for": [4], "pending": {}, "stage": "layer"}}


def test_without_a_layout_both_stay_named() -> None:
    decided = merge(_round(Stage.IDLE, 3, Stage.LAYER, 3), job=range(6))
    assert _named(decided) == [((4,), "hang"), ((5,), "hang")]


def test_both_inside_compute_at_the_same_step_stay_named() -> None:
    """Nothing tells which of two partners in their forward waits for the other."""
    decided = merge(_round(Stage.LAYER, 3, Stage.LAYER, 3), job=range(6), layout=LAYOUT)
    assert _named(decided) == [((4,), "hang"), ((5,), "hang")]


def test_both_outside_any_collective_stay_named() -> None:
    """Two idle ranks wait for nobody: both are frozen."""
    decided = merge(_round(Stage.IDLE, 3, Stage.IDLE, 3), job=range(6), layout=LAYOUT)
    assert _named(decided) == [((4,), "hang"), ((5,), "hang")]


def test_a_rank_at_a_later_step_waits_for_the_earlier_one() -> None:
    """Rank 4 never finished step 2; its partner, inside step 3, waits for it."""
    g0 = _group(
        (0, 2, 4),
        [_waiting_in_dp(0, 2), _waiting_in_dp(2, 2), RankEvidence(4, 2, 200, 1, NONE, 4.0)],
    )
    g1 = _group(
        (1, 3, 5),
        [_waiting_in_dp(1, 3), _waiting_in_dp(3, 3), RankEvidence(5, 3, 231, 6, NONE, 4.0)],
    )
    decided = merge([g0, g1], job=range(6), layout=LAYOUT)
    assert _named(decided) == [((4,), "hang")]
    assert decided[0][0].detail["waiting"]["5"]["stage"] == "optimizer"


def _behind(rank: int, stage: str, step: int, pending: dict[str, str] | None = None) -> Verdict:
    detail = {
        "coordinates": {str(rank): [step, 10]},
        "stages": {str(rank): stage},
        "pending": {str(rank): pending} if pending else {},
        "position": {str(rank): "behind"},
    }
    return Verdict(Failure.HANG, "progress", Status.ATTRIBUTED, (rank,), Scope.RANK, step, detail)


def test_ranks_of_different_replicas_are_not_linked() -> None:
    """Rank 4 (replica 2) idle, rank 1 (replica 0) in its forward: unrelated, both named."""
    decided = [(_behind(4, "idle", 3), 0), (_behind(1, "layer", 3), 1)]
    assert _named(release_held(decided, LAYOUT)) == [((4,), "hang"), ((1,), "hang")]


def test_a_rank_in_a_collective_whose_group_excludes_the_cause_stays_named() -> None:
    """Rank 5 sits in an all-reduce over ``d``, which rank 4 is not part of."""
    in_d = {"collective": "all_reduce", "group": "d"}
    in_t = {"collective": "all_reduce", "group": "t"}
    decided = [(_behind(4, "idle", 3), 0), (_behind(5, "collective", 3, in_d), 1)]
    assert _named(release_held(decided, LAYOUT)) == [((4,), "hang"), ((5,), "hang")]
    decided = [(_behind(4, "idle", 3), 0), (_behind(5, "collective", 3, in_t), 1)]
    assert _named(release_held(decided, LAYOUT)) == [((4,), "hang")]
    # batched point-to-point: members unknown to the record, the instance decides
    in_p2p = {"collective": "batch_isend_irecv", "group": "p2p"}
    decided = [(_behind(4, "idle", 3), 0), (_behind(5, "collective", 3, in_p2p), 1)]
    assert _named(release_held(decided, LAYOUT)) == [((4,), "hang")]


def test_every_held_rank_of_an_instance_is_attached_to_its_root() -> None:
    """PP 2 x TP 2 x DP 2: rank 0 (stage 0) is frozen at step 3; its TP partner 1 waits
    at step 3, the stage-1 ranks 2 and 3 of that replica are already a step later."""
    layout = MeshLayout.from_order("tp-pp-dp", tp=2, pp=2, dp=2)
    decided = [
        (_behind(0, "dataloader", 3), 0),
        (_behind(1, "layer", 3), 1),
        (_behind(2, "layer", 4), 2),
        (_behind(3, "optimizer", 4), 3),
    ]
    out = release_held(decided, layout)
    assert _named(out) == [((0,), "hang")]
    waiting = out[0][0].detail["waiting"]
    assert {r: w["for"] for r, w in waiting.items()} == {"1": [0], "2": [0], "3": [0]}
