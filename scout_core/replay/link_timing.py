"""The communication-timing rules of replay verdicts: slow links and late entries.

Contract: :class:`LinkJudge` adds to :class:`~.timing.Judge` the rules on a round's
communication timings: ``t_late`` (a rank that entered its EP all-to-all late round
after round is a rank-scoped ``comm_straggler``), ``t_gather`` / ``t_a2a`` (slow
groups confirmed over ``rounds`` rounds, diagnosed to a machine, a group or the job),
and ``t_bcast`` against the peer group's own recent clean rounds.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from scout_core.decision.c3 import C3Result
from scout_core.decision.diagnosis import SlowGroup, diagnose
from scout_core.records.record import Record
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.timing import TIMING_LATE, Judge
from scout_core.topology.mesh import attribution_scope
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["LinkJudge"]

TIMING_COMM = ("t_gather", "t_a2a")
TIMING_GROUP = "t_bcast"
_BASELINE_WINDOW = 16
"""Clean rounds of a group's broadcast time kept as its baseline (median)."""
_BASELINE_MIN = 2
"""Clean rounds needed before a group's broadcast time is judged at all."""


class LinkJudge(Judge):
    """:class:`~.timing.Judge` with the communication-timing rules (module doc)."""

    def _late(self, outcome: RoundOutcome, result: C3Result) -> list[Record]:
        """``t_late`` (module doc); the late rank's EP partners waited for it, so their
        lateness is near zero and they are never named."""
        if result.status is Status.INCONCLUSIVE:
            return []
        slow, median = self._slow(result)
        confirmed = self._confirm(TIMING_LATE, outcome, result, slow)
        if not confirmed or attribution_scope(len(result.ranks)) is not Scope.RANK:
            return []
        detail = {
            "median_s": median,
            "rounds": self.rounds,
            "explanation": "entered the EP all-to-all late in consecutive rounds while "
            "the ranks at its EP position in other replicas did not; its EP partners "
            "waited for it",
        }
        return [
            self._slow_record(
                outcome,
                result,
                failure=Failure.COMM_STRAGGLER,
                outliers=confirmed,
                scope=Scope.RANK,
                detail=detail,
            )
        ]

    def _comm(self, outcome: RoundOutcome) -> list[Record]:
        slow_groups: list[SlowGroup] = []
        timings: dict[str, Any] = {}
        base: C3Result | None = None
        for key, result in outcome.results.items():
            leaf = key.rsplit("/", 1)[-1]
            if result.mode is not Mode.STATISTICAL or not leaf.startswith(TIMING_COMM):
                continue
            if result.status is Status.INCONCLUSIVE:
                continue
            slow, median = self._slow(result)
            confirmed = self._confirm(leaf, outcome, result, slow)
            timings[leaf] = {"median_s": median, "evidence": list(result.evidence)}
            for r in confirmed:
                found = self.comm_group_of(leaf, r) if self.comm_group_of else None
                if found is not None:
                    slow_groups.append(SlowGroup(found[0], found[1]))
                    base = result
        if not slow_groups:
            return []
        diagnosis = diagnose(slow_groups, self.hosts)
        assert diagnosis is not None
        members = tuple(sorted({r for g in diagnosis.groups for r in g.ranks}))
        kinds = {g.kind for g in diagnosis.groups}
        scope = (
            Scope.MACHINE if diagnosis.scope is Scope.MACHINE and len(kinds) > 1 else Scope.GROUP
        )
        if diagnosis.scope is Scope.JOB:
            scope = Scope.JOB
        return [
            self._record(
                outcome,
                base,
                surface=base.surface if base is not None else f"{outcome.recipe.name}/t_comm",
                mode=Mode.STATISTICAL,
                status=Status.ATTRIBUTED,
                failure=Failure.COMM_STRAGGLER,
                outliers=members,
                group=members,
                scope=scope,
                detail={
                    "diagnosis": diagnosis.kind.value,
                    "explanation": diagnosis.explanation,
                    "slow_groups": [[g.kind, list(g.ranks)] for g in diagnosis.groups],
                    "timings": timings,
                },
            )
        ]

    def _group_comm(self, outcome: RoundOutcome) -> list[Record]:
        """The peer group's broadcast time against its own recent clean rounds."""
        result = outcome.results.get(f"{outcome.recipe.name}/{TIMING_GROUP}")
        if result is None or len(result.ranks) < 2:
            return []
        values = sorted(e for e in result.evidence if isinstance(e, float))
        if len(values) != len(result.ranks):
            return []  # a timing went missing: neither confirms nor clears
        value = values[-2]
        group = tuple(result.ranks)
        series = (outcome.recipe.series, group)
        base = self._bcast_base.setdefault(series, deque(maxlen=_BASELINE_WINDOW))
        slow = False
        median = 0.0
        if len(base) >= _BASELINE_MIN:
            median = statistics.median(base)
            slow = value - median >= self.min_excess_s and (
                median <= 0 or value / median >= self.min_ratio
            )
        if not slow:
            base.append(value)  # only clean rounds form the baseline: a slow link stays visible
        streak = self._bcast_streak[series] = self._bcast_streak.get(series, 0) + 1 if slow else 0
        if streak < self.rounds:
            return []
        diagnosis = diagnose([SlowGroup(self.peer_kind, group)], self.hosts)
        assert diagnosis is not None
        detail = {
            "diagnosis": diagnosis.kind.value,
            "explanation": diagnosis.explanation,
            "source": outcome.source,
            "t_bcast_s": value,
            "baseline_median_s": median,
            "rounds": streak,
        }
        return [
            self._slow_record(
                outcome,
                result,
                failure=Failure.COMM_STRAGGLER,
                outliers=group,
                scope=Scope.GROUP,
                detail=detail,
            )
        ]
