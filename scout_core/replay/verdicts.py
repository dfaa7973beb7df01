"""Turn a recipe round's C3 results into evidence records.

Contract: :meth:`VerdictMaker.judge` turns one round into records (none when every surface
agrees) by rules whose inputs are identical on every peer, so every peer reaches the same
verdicts. An exact surface attributed, by a strict majority or by a referee, is an ``sdc``
naming exactly the outliers; readiness or received inputs that differ, missing evidence or no
strict majority read ``inconclusive`` (without a majority: a group-scoped ``sdc`` with no
culprit). A timing names a rank (``straggler`` from ``t_M``, ``comm_straggler`` from
``t_late``) only after ``straggler_rounds`` consecutive outlier rounds of one timing series
past the excess and ratio guards; ``t_gather``, ``t_a2a`` and ``t_bcast`` mark a group, never
a rank. docs/replay.md, "Verdicts".
"""

from __future__ import annotations

from scout_core.decision.c3 import C3Result
from scout_core.records.record import Record
from scout_core.replay import control, gaps
from scout_core.replay.link_timing import LinkJudge
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.timing import TIMING_COMPUTE, TIMING_LATE
from scout_core.topology.mesh import attribution_scope
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["VerdictMaker"]

_NOT_COMPARED = ("/ready", "/threads", "/received", "/gap", "/steps", "/micro")
"""Surfaces that are no numerical result of the replay: never an SDC."""


class VerdictMaker(LinkJudge):
    """Turns each round into records; stateful across rounds only for the timing rules'
    streaks and baselines (:class:`~.timing.Judge`, :class:`~.link_timing.LinkJudge`)."""

    def judge(self, outcome: RoundOutcome) -> list[Record]:
        """Records for one round (empty when every surface agrees). Its timing pool is judged
        first, whatever this group's readiness, so every pool member keeps the same streaks."""
        return self._pooled(outcome) + self._judge_group(outcome)

    def _judge_group(self, outcome: RoundOutcome) -> list[Record]:
        name = outcome.recipe.name
        split = control.diverged(name, outcome.results)
        if not outcome.ready and split:
            return [self._divergence(outcome, result) for result in split]
        if not outcome.ready:
            ready = outcome.results.get(f"{name}/ready")
            odd = list(ready.outliers) if ready is not None else []
            return [
                self._group_inconclusive(
                    outcome,
                    ready,
                    {"reason": outcome.reason, "differing": odd},
                    surface=f"{name}/ready",
                )
            ]
        received = outcome.results.get(f"{name}/received")
        if received is not None and received.status is not Status.AGREE:
            return [
                self._group_inconclusive(
                    outcome,
                    received,
                    {"reason": "peers did not receive identical replay inputs"},
                )
            ]
        shard = outcome.results.get(f"{name}/shard")
        params = outcome.results.get(f"{name}/params")
        if (
            shard is not None
            and params is not None
            and shard.status is Status.AGREE
            and params.status is not Status.AGREE
        ):
            # Equal local shards, unequal gathered parameters: the difference came through the
            # gather from a shard partner, named by its own replica group; this group names none.
            return [
                self._group_inconclusive(
                    outcome,
                    params,
                    {
                        "reason": "local shards agree but gathered parameters differ: "
                        "a shard partner's shard differs",
                        "differing": list(params.outliers),
                    },
                )
            ]
        records: list[Record] = []
        gaps = self._gaps(outcome)
        records.extend(gaps)
        settled = outcome.referee.surfaces if outcome.referee is not None else ()
        for key, result in outcome.results.items():
            leaf = key.rsplit("/", 1)[-1]
            if key.endswith(_NOT_COMPARED):
                continue
            if result.mode is Mode.EXACT and leaf in settled:
                records.append(self._refereed(outcome, result))
            elif result.mode is Mode.EXACT:
                found = self._exact(outcome, result)
                # The gap record already says why evidence is missing and from whom.
                records.extend(r for r in found if not (gaps and r.status is Status.INCONCLUSIVE))
            elif leaf in TIMING_COMPUTE:
                records.extend(self._straggler(outcome, result))
            elif leaf == TIMING_LATE:
                records.extend(self._late(outcome, result))
        records.extend(self._comm(outcome))
        records.extend(self._group_comm(outcome))
        return records

    def _refereed(self, outcome: RoundOutcome, result: C3Result) -> Record:
        """A pair's computed surface after its referee phase (:mod:`.referee`)."""
        finding = outcome.referee
        assert finding is not None
        leaf = result.surface.rsplit("/", 1)[-1]
        detail: dict[str, object] = {
            "reason": finding.reason,
            "referee": finding.referee,
            "signatures": {
                str(r): (f"{v:016x}" if isinstance(v, int) else None)
                for r, sigs in finding.signatures.items()
                for v in [sigs.get(leaf)]
            },
        }
        if finding.culprit is None:
            return self._group_inconclusive(
                outcome,
                result,
                detail,
                failure=Failure.SDC,
            )
        detail["healthy"] = finding.healthy
        return self._record(
            outcome,
            result,
            surface=result.surface,
            mode=Mode.EXACT,
            status=Status.ATTRIBUTED,
            failure=Failure.SDC,
            outliers=(finding.culprit,),
            scope=Scope.RANK,
            detail=detail,
        )

    def _divergence(self, outcome: RoundOutcome, result: C3Result) -> Record:
        """A control-flow divergence (:mod:`.control`): the peers disagree on how many
        optimizer steps or micro-batches they ran; the outlier is named when C3 can."""
        attributed = result.status is Status.ATTRIBUTED
        return self._record(
            outcome,
            result,
            surface=result.surface,
            mode=Mode.EXACT,
            status=Status.ATTRIBUTED if attributed else Status.INCONCLUSIVE,
            failure=Failure.PROTOCOL_MISMATCH,
            outliers=result.outliers if attributed else (),
            scope=(attribution_scope(len(result.ranks)) or Scope.GROUP)
            if attributed
            else Scope.GROUP,
            detail={"reason": "control-flow divergence", **control.describe(result)},
        )

    def _gaps(self, outcome: RoundOutcome) -> list[Record]:
        """One inconclusive record naming the peers whose evidence is missing, and why."""
        result = outcome.results.get(f"{outcome.recipe.name}/gap")
        if result is None:
            return []
        codes = {r: e for r, e in zip(result.ranks, result.evidence, strict=True)}
        missing = gaps.describe({r: c if isinstance(c, int) else -1 for r, c in codes.items()})
        if not missing:
            return []
        return [
            self._group_inconclusive(
                outcome,
                result,
                {"reason": "evidence missing on some peer", "missing": missing},
            )
        ]

    def _exact(self, outcome: RoundOutcome, result: C3Result) -> list[Record]:
        if result.status is Status.AGREE:
            return []
        if result.status is Status.ATTRIBUTED:
            scope = attribution_scope(len(result.ranks)) or Scope.GROUP
            return [
                self._record(
                    outcome,
                    result,
                    surface=result.surface,
                    mode=Mode.EXACT,
                    status=Status.ATTRIBUTED,
                    failure=Failure.SDC,
                    outliers=result.outliers,
                    scope=scope,
                )
            ]
        missing = any(e is None for e in result.evidence)
        reason = "evidence missing on some peer" if missing else "no strict majority"
        return [
            self._group_inconclusive(
                outcome,
                result,
                {"reason": reason},
                failure=None if missing else Failure.SDC,
            )
        ]
