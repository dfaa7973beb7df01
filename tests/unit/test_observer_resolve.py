"""``resolve`` keeps a verdict that names an absent rank (its observer did not answer).

A round names an absent peer as unresponsive only when every present member is stuck
waiting for it (``diagnosis_round``); that rank has no evidence in the round, and
resolving the group's verdicts must keep it named rather than fail looking it up
(a dead peer otherwise left the round without any verdict).
"""

from __future__ import annotations

from scout_core.observer.progress import Stage
from scout_core.observer.resolve import merge, resolve
from scout_core.observer.verdict import RankEvidence, Verdict
from scout_core.vocabulary import Failure, Scope, Status


def _stuck(rank: int) -> RankEvidence:
    return RankEvidence(rank, 4, 120, int(Stage.COLLECTIVE), (1, 2, 3), 3.0)


def test_an_absent_rank_named_by_the_round_stays_named() -> None:
    evidence = [_stuck(r) for r in (0, 1, 3)]
    absent = Verdict(
        Failure.HANG,
        "observer",
        Status.ATTRIBUTED,
        (2,),
        Scope.RANK,
        4,
        {"reason": "the observers of ranks [2] did not answer", "present": [0, 1, 3]},
    )
    result = resolve(
        (0, 1, 2, 3),
        0,
        evidence,
        [absent],
        history={},
        members_of=lambda e: (0, 1, 2, 3),
        lookup=lambda r: None,
        min_quiet_s=1.0,
    )
    assert [(v.failure, v.outliers, v.surface) for v in result.verdicts] == [
        (Failure.HANG, (2,), "observer")
    ]
    merged = merge([result], job=(0, 1, 2, 3))
    assert [(v.failure, v.outliers, v.step) for v, _ in merged] == [(Failure.HANG, (2,), 4)]
