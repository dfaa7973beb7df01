"""Record building and the compute-timing rules of replay verdicts: stragglers.

Contract: :class:`Judge` builds ``scout.verdict/1`` records from round outcomes and keeps the
only state across rounds, the timing rules' streaks and baselines, per timing *series* (one
recipe's rounds never confirm or clear another's). A round's ``t_M`` is judged over its timing
pool when the driver attached one (statistical C3 over each class of equal work of three or
more ranks, a pair's own history for two), else over its peer group. The link rules build on
it (:mod:`.link_timing`). docs/replay.md, "Verdicts" and "Timing pools".
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scout_core.decision.c3 import C3Result, decide_statistical
from scout_core.decision.pools import OwnHistory, PoolTiming, excluded, pool_classes
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.replay.runner import RoundOutcome
from scout_core.topology.mesh import attribution_scope
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["Judge"]

log = logging.getLogger(__name__)

TIMING_COMPUTE = ("t_M",)
TIMING_LATE = "t_late"
"""A rank's lateness into an all-to-all (:mod:`scout_core.replay.all_to_all`)."""


class Judge:
    """Builds records; keeps the timing rules' streaks and baselines across rounds."""

    def __init__(
        self,
        *,
        run_id: str,
        hosts: Mapping[int, str],
        rounds: int,
        min_excess_s: float,
        min_ratio: float,
        comm_group_of: Callable[[str, int], tuple[str, tuple[int, ...]] | None] | None = None,
        peer_kind: str = "peer",
        kappa: float = 5.0,
        peer_of: Callable[[int], tuple[int, ...]] | None = None,
        rank: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.hosts = dict(hosts)
        self.rounds = rounds
        self.min_excess_s = min_excess_s
        self.min_ratio = min_ratio
        self.comm_group_of = comm_group_of
        self.peer_kind = peer_kind
        self.kappa = kappa
        self.peer_of = peer_of
        """A rank's peer group: the ``group`` of a pool record naming it (its lowest rank
        writes it, as if the peer group had judged alone)."""
        self.rank = rank
        """This rank: a pool's record reaches only its ``group``'s members (every pool member
        judges it, to keep the same streaks)."""
        self.own = OwnHistory(rounds=rounds, min_excess_s=min_excess_s, min_ratio=min_ratio)
        """Each rank's own recent clean ``t_M`` per series, for a pair (:mod:`..pools`)."""
        self._excluded: set[tuple[str, int, str]] = set()
        self._streak: dict[tuple[str, str, int], int] = {}
        self._bcast_base: dict[tuple[str, tuple[int, ...]], deque[float]] = {}
        self._bcast_streak: dict[tuple[str, tuple[int, ...]], int] = {}

    def _slow_record(
        self,
        outcome: RoundOutcome,
        result: C3Result,
        *,
        failure: Failure,
        outliers: Sequence[int],
        scope: Scope,
        detail: Mapping[str, Any],
    ) -> Record:
        """A timing surface's attribution: a straggler, or a slow group's broadcast."""
        return self._record(
            outcome,
            result,
            surface=result.surface,
            mode=Mode.STATISTICAL,
            status=Status.ATTRIBUTED,
            failure=failure,
            outliers=outliers,
            scope=scope,
            detail=detail,
        )

    def _record(
        self,
        outcome: RoundOutcome,
        result: C3Result | None,
        *,
        surface: str,
        mode: Mode,
        status: Status,
        failure: Failure | None,
        outliers: Sequence[int] = (),
        scope: Scope | None,
        group: Sequence[int] | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Record:
        info: dict[str, Any] = {"recipe": outcome.recipe.kind}
        if outcome.recipe.path is not None:
            info["module"] = outcome.recipe.path
        if result is not None:
            info["evidence"] = [f"{e:016x}" if isinstance(e, int) else e for e in result.evidence]
        info.update(detail or {})
        return Record(
            schema=VERDICT_SCHEMA,
            run_id=self.run_id,
            step=outcome.step,
            surface=surface,
            mode=mode,
            status=status,
            failure=failure,
            group=tuple(outcome.group if group is None else group),
            outliers=tuple(outliers),
            scope=scope,
            hosts=tuple(sorted({self.hosts.get(r, "?") for r in outliers})),
            detail=info,
        )

    def _group_inconclusive(
        self,
        outcome: RoundOutcome,
        result: C3Result | None,
        detail: Mapping[str, Any],
        *,
        surface: str | None = None,
        failure: Failure | None = None,
    ) -> Record:
        """A group-scoped exact record that names no rank (``surface``: the result's)."""
        if surface is None:
            assert result is not None, "a record without a result names its surface"
            surface = result.surface
        return self._record(
            outcome,
            result,
            surface=surface,
            mode=Mode.EXACT,
            status=Status.INCONCLUSIVE,
            failure=failure,
            scope=Scope.GROUP,
            detail=detail,
        )

    def _slow(self, result: C3Result) -> tuple[list[int], float]:
        """Ranks whose timing is an outlier *and* passes the excess and ratio guards."""
        values = [e for e in result.evidence if isinstance(e, float)]
        if result.status is not Status.ATTRIBUTED or len(values) != len(result.ranks):
            return [], 0.0
        median = statistics.median(values)
        slow = [
            r
            for r, bit, t in zip(result.ranks, result.bitmap, values, strict=True)
            if bit
            and t - median >= self.min_excess_s
            and (median <= 0 or t / median >= self.min_ratio)
        ]
        return slow, median

    def _confirm(
        self, leaf: str, outcome: RoundOutcome, result: C3Result, slow: Sequence[int]
    ) -> list[int]:
        """Ranks slow in ``rounds`` consecutive rounds of this recipe's timing series.

        Streaks are per timing surface and series (:attr:`Recipe.series`): a hidden layer's
        rounds never confirm or clear the embedding's, whatever ran in between, and one slow
        step across several recipes confirms nothing."""
        confirmed = []
        series = outcome.recipe.series
        for r in result.ranks:
            key = (leaf, series, r)
            self._streak[key] = self._streak.get(key, 0) + 1 if r in slow else 0
            if self._streak[key] >= self.rounds:
                confirmed.append(r)
        return confirmed

    def _straggler(self, outcome: RoundOutcome, result: C3Result) -> list[Record]:
        if outcome.pool is not None:
            return []  # judged over the round's timing pool (_pooled)
        if result.status is Status.INCONCLUSIVE:
            return []  # a timing that went missing neither confirms nor clears a streak
        if len(result.ranks) == 2:
            values = [e for e in result.evidence if isinstance(e, float)]
            if len(values) != 2:
                return []
            pair = tuple(zip(result.ranks, values, strict=True))
            return self._pair(outcome, (pair[0], pair[1]))
        slow, median = self._slow(result)
        confirmed = self._confirm("t_M", outcome, result, slow)
        if not confirmed or (attribution_scope(len(result.ranks)) is not Scope.RANK):
            return []
        detail = {"median_s": median, "rounds": self.rounds}
        return [
            self._slow_record(
                outcome,
                result,
                failure=Failure.STRAGGLER,
                outliers=confirmed,
                scope=Scope.RANK,
                detail=detail,
            )
        ]

    def _pooled(self, outcome: RoundOutcome) -> list[Record]:
        """``t_M`` over the timing pool (module doc): records whose ``group`` holds this rank."""
        pool = outcome.pool
        if pool is None:
            return []
        found = self._pool_records(outcome, pool)
        return [r for r in found if self.rank is None or self.rank in r.group]

    def _pool_records(self, outcome: RoundOutcome, pool: PoolTiming) -> list[Record]:
        self._log_excluded(outcome, pool)
        records: list[Record] = []
        surface = f"{outcome.recipe.name}/t_M"
        for cls in pool_classes(pool):
            times = [pool.time_of(r) for r in cls]
            values = [t for t in times if t is not None]
            if len(cls) == 2:
                records.extend(self._pair(outcome, ((cls[0], values[0]), (cls[1], values[1]))))
                continue
            if len(cls) < 3:
                continue
            decision = decide_statistical(values, self.kappa)
            result = C3Result(
                surface, Mode.STATISTICAL, decision.status, decision.bitmap, tuple(values), cls
            )
            slow, median = self._slow(result)
            detail = {"median_s": median, "rounds": self.rounds, "pool": list(cls)}
            for rank in self._confirm("t_M", outcome, result, slow):
                records.append(
                    self._t_m_record(
                        outcome,
                        result,
                        status=Status.ATTRIBUTED,
                        outliers=(rank,),
                        scope=Scope.RANK,
                        group=self._home(rank, cls),
                        detail=detail,
                    )
                )
        return records

    def _t_m_record(
        self,
        outcome: RoundOutcome,
        result: C3Result,
        *,
        status: Status,
        scope: Scope,
        group: Sequence[int],
        detail: Mapping[str, Any],
        outliers: Sequence[int] = (),
    ) -> Record:
        """A straggler record on the round's pooled ``t_M`` (statistical C3)."""
        return self._record(
            outcome,
            result,
            surface=result.surface,
            mode=Mode.STATISTICAL,
            status=status,
            failure=Failure.STRAGGLER,
            outliers=outliers,
            scope=scope,
            group=group,
            detail=detail,
        )

    def _home(self, rank: int, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """The ``group`` of a record naming ``rank`` out of ``ranks``: its peer group."""
        return ranks if self.peer_of is None else self.peer_of(rank)

    def _log_excluded(self, outcome: RoundOutcome, pool: PoolTiming) -> None:
        """Say once per (series, rank, reason) why a member left the pool's comparison."""
        for rank, reason in excluded(pool).items():
            key = (outcome.recipe.series, rank, reason)
            if key in self._excluded or len(self._excluded) >= 1024:
                continue
            self._excluded.add(key)
            log.warning(
                "rank %d is left out of the %s timing pool %s at step %d: it %s",
                rank,
                outcome.recipe.series,
                list(pool.ranks),
                outcome.step,
                reason,
            )

    def _pair(
        self, outcome: RoundOutcome, pair: tuple[tuple[int, float], tuple[int, float]]
    ) -> list[Record]:
        """Two ranks of equal work and nobody else: each against its own history."""
        call = self.own.judge(outcome.recipe.series, pair)
        ranks = tuple(r for r, _ in pair)
        surface = f"{outcome.recipe.name}/t_M"
        named = call.named
        bitmap = tuple(r == named for r in ranks)
        status = Status.ATTRIBUTED if named is not None else Status.AGREE
        result = C3Result(
            surface, Mode.STATISTICAL, status, bitmap, tuple(t for _, t in pair), ranks
        )
        medians = {str(r): m for r, m in call.medians.items()}
        records: list[Record] = []
        if named is not None:
            records.append(
                self._t_m_record(
                    outcome,
                    result,
                    status=Status.ATTRIBUTED,
                    outliers=(named,),
                    scope=Scope.RANK,
                    group=self._home(named, ranks) if outcome.pool is not None else ranks,
                    detail={
                        "rule": "own history",
                        "history_median_s": medians,
                        "rounds": self.rounds,
                        "explanation": "slower than its own recent rounds in consecutive "
                        "rounds while the other rank of equal work stayed within its own",
                    },
                )
            )
        if call.joint:
            records.append(
                self._t_m_record(
                    outcome,
                    result,
                    status=Status.INCONCLUSIVE,
                    scope=Scope.GROUP,
                    group=ranks,
                    detail={
                        "rule": "own history",
                        "history_median_s": medians,
                        "rounds": self.rounds,
                        "explanation": "both ranks slower than their own recent rounds: "
                        "a job-wide slowdown, no rank named",
                    },
                )
            )
        return records
