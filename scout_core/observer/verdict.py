"""The hang decision: from the observers' gathered evidence to verdicts (paper §7).

Contract: a group's observers gather each rank's ``(step, op id)``, stage and pending
fingerprint in one C3 AllGather, and each applies :func:`decide_round`, a pure function,
to the same table, so all reach the same verdicts with no coordinator. The rule table:
docs/observer.md, "Verdicts".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scout_core.decision.c3 import decide_exact
from scout_core.observer.fingerprint import describe
from scout_core.observer.progress import Stage
from scout_core.vocabulary import Failure, Scope, Status

__all__ = ["RankEvidence", "Verdict", "decide_round", "stall_failure"]

_STAGE_FAILURE = {
    Stage.DATALOADER: (Failure.INPUT_STALL, "stage/dataloader"),
    Stage.CHECKPOINT_READ: (Failure.CHECKPOINT_STALL, "stage/checkpoint"),
    Stage.CHECKPOINT_WRITE: (Failure.CHECKPOINT_STALL, "stage/checkpoint"),
}


@dataclass(frozen=True)
class RankEvidence:
    """What one rank's observer contributed to a round."""

    rank: int
    step: int
    op_id: int
    stage: int
    fingerprint: tuple[int, int, int]
    quiet_s: float
    peer: int | None = None
    """The partner of a pending point-to-point operation (a global rank)."""
    template: tuple[int, int, int] | None = None
    """What the rank entered at the same position of its previous step (in a collective)."""

    def to_json(self) -> list[Any]:
        return [
            self.rank,
            self.step,
            self.op_id,
            self.stage,
            list(self.fingerprint),
            self.quiet_s,
            self.peer,
            None if self.template is None else list(self.template),
        ]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> RankEvidence:
        rank, step, op_id, stage, fp, quiet, peer, *rest = data
        t = rest[0] if rest else None
        return cls(
            int(rank),
            int(step),
            int(op_id),
            int(stage),
            (int(fp[0]), int(fp[1]), int(fp[2])),
            float(quiet),
            None if peer is None else int(peer),
            None if t is None else (int(t[0]), int(t[1]), int(t[2])),
        )


@dataclass(frozen=True)
class Verdict:
    """One decision of a round; ``outliers`` are global ranks."""

    failure: Failure
    surface: str
    status: Status
    outliers: tuple[int, ...]
    scope: Scope
    step: int
    detail: dict[str, Any] = field(default_factory=dict)
    group: tuple[int, ...] = ()
    """The ranks the record is about (empty: the peer group that decided it)."""

    @property
    def localized(self) -> bool:
        """Names culprit ranks (what the hang actions act on)."""
        return self.status is Status.ATTRIBUTED and bool(self.outliers)

    def to_json(self) -> dict[str, Any]:
        return {
            "failure": self.failure.value,
            "surface": self.surface,
            "status": self.status.value,
            "outliers": list(self.outliers),
            "scope": self.scope.value,
            "step": self.step,
            "detail": self.detail,
            "group": list(self.group),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(
            Failure(data["failure"]),
            str(data["surface"]),
            Status(data["status"]),
            tuple(int(r) for r in data["outliers"]),
            Scope(data["scope"]),
            int(data["step"]),
            dict(data["detail"]),
            tuple(int(r) for r in data["group"]),
        )


def stall_failure(stage: int) -> tuple[Failure, str]:
    """The failure and surface for a rank stuck in ``stage``."""
    try:
        return _STAGE_FAILURE[Stage(stage)]
    except (KeyError, ValueError):
        return Failure.HANG, "progress"


def _stage_name(stage: int) -> str:
    try:
        return Stage(stage).name.lower()
    except ValueError:
        return f"unknown({stage})"


def _detail(evidence: Sequence[RankEvidence]) -> dict[str, Any]:
    return {
        "coordinates": {str(e.rank): [e.step, e.op_id] for e in evidence},
        "stages": {str(e.rank): _stage_name(e.stage) for e in evidence},
        "pending": {
            str(e.rank): describe(e.fingerprint) for e in evidence if e.stage == Stage.COLLECTIVE
        },
        "quiet_s": {str(e.rank): round(e.quiet_s, 3) for e in evidence},
    }


def _silence(evidence: Sequence[RankEvidence], outliers: Sequence[int]) -> str:
    """The measured silence of ``outliers`` and of the other ranks, for ``reason``.

    Each is the time since that rank's last publish, measured at the round's start: never a
    configured timeout."""
    named = [e for e in evidence if e.rank in outliers]
    others = [e for e in evidence if e.rank not in outliers]
    parts = [
        f"rank {e.rank} has made no progress for {e.quiet_s:.1f} s "
        f"({_stage_name(e.stage)} at step {e.step}, op {e.op_id})"
        for e in named
    ]
    text = "; ".join(parts)
    if others:
        quiet = sorted(e.quiet_s for e in others)
        span = (
            f"{quiet[0]:.1f} s"
            if quiet[-1] - quiet[0] < 0.05
            else (f"{quiet[0]:.1f}-{quiet[-1]:.1f} s")
        )
        text += f"; ranks {[e.rank for e in others]} have been waiting {span}"
    return text


def decide_round(
    evidence: Sequence[RankEvidence], *, min_quiet_s: float, world_size: int
) -> list[Verdict]:
    """Every verdict the gathered ``evidence`` supports (empty: nothing is stalled); one with
    no culprit has scope ``job`` over all ``world_size`` ranks, else ``group``."""
    if not evidence:
        raise ValueError("a round needs the evidence of at least one rank")
    if any(e.quiet_s < min_quiet_s for e in evidence):
        return []
    ranks = [e.rank for e in evidence]
    group_scope = Scope.JOB if len(ranks) >= world_size else Scope.GROUP
    detail = _detail(evidence)
    steps = sorted(e.step for e in evidence)
    step = steps[len(steps) // 2]

    progress = decide_exact([(e.step, e.op_id) for e in evidence])
    if progress.status is Status.INCONCLUSIVE:
        return [
            Verdict(Failure.HANG, "progress", Status.INCONCLUSIVE, (), group_scope, step, detail)
        ]
    if progress.status is Status.ATTRIBUTED:
        majority = next(
            (e.step, e.op_id) for e, bit in zip(evidence, progress.bitmap, strict=True) if not bit
        )
        by_failure: dict[tuple[Failure, str], list[int]] = {}
        for e, bit in zip(evidence, progress.bitmap, strict=True):
            if bit:
                by_failure.setdefault(stall_failure(e.stage), []).append(e.rank)
        position = {
            str(e.rank): "behind" if (e.step, e.op_id) < majority else "ahead"
            for e, bit in zip(evidence, progress.bitmap, strict=True)
            if bit
        }
        return [
            Verdict(
                failure,
                surface,
                Status.ATTRIBUTED,
                tuple(outliers),
                Scope.RANK,
                majority[0],
                {
                    **detail,
                    "majority": list(majority),
                    "position": position,
                    "reason": _silence(evidence, outliers),
                },
            )
            for (failure, surface), outliers in by_failure.items()
        ]

    fp = decide_exact([e.fingerprint for e in evidence])
    if fp.status is Status.ATTRIBUTED:
        outliers = tuple(r for r, bit in zip(ranks, fp.bitmap, strict=True) if bit)
        return [
            Verdict(
                Failure.PROTOCOL_MISMATCH,
                "collective",
                Status.ATTRIBUTED,
                outliers,
                Scope.RANK,
                step,
                detail,
            )
        ]
    if fp.status is Status.INCONCLUSIVE:
        return [
            Verdict(
                Failure.PROTOCOL_MISMATCH,
                "collective",
                Status.INCONCLUSIVE,
                (),
                group_scope,
                step,
                detail,
            )
        ]
    failure, surface = Failure.GROUP_STALL, "progress"
    stages = {e.stage for e in evidence}
    if len(stages) == 1:
        stalled, where = stall_failure(next(iter(stages)))
        if stalled is not Failure.HANG:
            failure, surface = stalled, where
    return [Verdict(failure, surface, Status.AGREE, (), group_scope, step, detail)]
