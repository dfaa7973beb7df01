"""Scoring a campaign from the evidence its trials wrote (definitions: docs/campaign.md).

A **claim** is a distinct (failure, outliers) pair among a trial's failing verdicts; it is
**true** when it names the victim with a failure the fault kind accepts (:data:`ACCEPTED`).
:func:`score_trial` gives one trial's outcome, claims, time to verdict and clean-step
findings; :func:`summarize` gives precision, recall, exact-rank accuracy, time to verdict
and false positives per 1,000 clean steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scout_core.records.reading import Report
from scout_core.records.record import VERDICT_SCHEMA, Record

__all__ = ["ACCEPTED", "Claim", "TrialScore", "claims", "score_trial", "summarize"]

_SDC = frozenset({"sdc"})
ACCEPTED: Mapping[str, frozenset[str]] = {
    "param_sdc": _SDC,
    "compute_sdc": _SDC,
    "optimizer_sdc": _SDC,
    "compute_straggler": frozenset({"straggler"}),
    "comm_straggler": frozenset({"comm_straggler"}),
    "hang_sigstop": frozenset({"hang"}),
    "hang_gil": frozenset({"hang"}),
    "protocol_mismatch": frozenset({"protocol_mismatch"}),
    "input_stall": frozenset({"input_stall"}),
    "checkpoint_stall": frozenset({"checkpoint_stall"}),
    "clean": frozenset(),
    "collective_stall": frozenset(),  # a test kind: the stalled group is named, no rank
    "job_slowdown": frozenset(),  # a test kind: a slow job, no rank to name
}
"""The failure classes a verdict may report for each fault kind to count as true."""


@dataclass(frozen=True)
class Claim:
    """One distinct (failure, outliers) of a trial's verdicts, first seen at ``step``."""

    failure: str
    outliers: tuple[int, ...]
    step: int
    time: float
    surface: str
    records: int


def _failing(report: Report, run_id: str | None) -> Iterator[Record]:
    """The verdict records of ``report`` (of run ``run_id``, when given) reporting a failure."""
    for r in report.records:
        wanted = run_id is None or r.run_id == run_id
        if wanted and r.schema == VERDICT_SCHEMA and r.failure is not None:
            yield r


def claims(report: Report, run_id: str | None = None) -> list[Claim]:
    """The claims of ``report`` (of run ``run_id`` only, when given), in first-seen order."""
    seen: dict[tuple[str, tuple[int, ...]], list[Record]] = {}
    for r in _failing(report, run_id):
        assert r.failure is not None
        seen.setdefault((r.failure.value, tuple(r.outliers)), []).append(r)
    out = []
    for (failure, outliers), records in seen.items():
        first = min(records, key=lambda r: (r.step, r.time))
        out.append(Claim(failure, outliers, first.step, first.time, first.surface, len(records)))
    return sorted(out, key=lambda c: (c.step, c.time))


def _findings_at_clean_steps(
    report: Report, run_id: str | None, before: int | None
) -> list[tuple[int, str, tuple[int, ...]]]:
    """Distinct (step, failure, outliers) of verdicts at clean steps (all, or before ``before``)."""
    out: set[tuple[int, str, tuple[int, ...]]] = set()
    for r in _failing(report, run_id):
        if r.failure is not None and (before is None or r.step < before):
            out.add((r.step, r.failure.value, tuple(r.outliers)))
    return sorted(out)


@dataclass(frozen=True)
class TrialScore:
    """What one trial's evidence says about SCOUT (module doc)."""

    index: int
    setup: str
    kind: str
    victim: int | None
    step: int
    outcome: str
    claims: tuple[Claim, ...]
    true_claims: int
    named_claims: int
    """Claims that name ranks (the denominator of precision)."""
    exact_rank: bool | None
    """Whether the first claim of an accepted class names exactly the victim; None if none."""
    ttv_s: float | None
    ttv_steps: int | None
    clean_steps: int
    clean_findings: int
    error: str | None = None
    seconds: float | None = None
    """The trial's wall time, start-up included (set by the runner)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["claims"] = [asdict(c) for c in self.claims]
        return out


def score_trial(
    trial: Mapping[str, Any],
    report: Report,
    *,
    injected_at: float | None,
    trained: int,
    run_id: str | None = None,
    error: str | None = None,
    fired: bool = True,
) -> TrialScore:
    """Score one trial (a :class:`~scout_core.campaign.plan.Trial` as a dict) from ``report``.

    ``injected_at`` is the Unix time the fault struck, ``trained`` the steps completed;
    ``fired`` false makes the trial ``not_injected``, left out of every score."""
    kind, victim, step = str(trial["kind"]), trial["victim"], int(trial["step"])
    found = claims(report, run_id)
    named = [c for c in found if c.outliers]
    accepted = ACCEPTED[kind]
    true = [c for c in named if c.failure in accepted and victim in c.outliers]
    right_class = [c for c in named if c.failure in accepted]
    clean = victim is None
    before = None if clean else step
    clean_steps = trained if clean else min(step, trained)
    at_clean = _findings_at_clean_steps(report, run_id, before)
    exact: bool | None = None
    if right_class and not clean:
        exact = right_class[0].outliers == (victim,)
    ttv_s: float | None = None
    ttv_steps: int | None = None
    if true:
        first = true[0]
        ttv_steps = first.step - step
        if injected_at is not None:
            ttv_s = max(0.0, first.time - injected_at)
    if not fired and not clean:
        outcome = "not_injected"
    elif error is not None and not found:
        outcome = "error"
    elif clean:
        outcome = "false_alarm" if found else "clean"
    elif true:
        outcome = "detected"
    elif right_class:
        outcome = "wrong_rank"
    elif named:
        outcome = "wrong_class"
    else:
        outcome = "missed"
    return TrialScore(
        index=int(trial["index"]),
        setup=str(trial["setup"]),
        kind=kind,
        victim=victim,
        step=step,
        outcome=outcome,
        claims=tuple(found),
        true_claims=len(true),
        named_claims=len(named),
        exact_rank=exact,
        ttv_s=ttv_s,
        ttv_steps=ttv_steps,
        clean_steps=clean_steps,
        clean_findings=len(at_clean),
        error=error,
    )


def _ratio(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "worst": None}
    return {"median": float(statistics.median(values)), "worst": float(max(values))}


def summarize(scores: Iterable[TrialScore]) -> dict[str, Any]:
    """The campaign's scores over ``scores`` (definitions: docs/campaign.md)."""
    every = list(scores)
    rows = [s for s in every if s.outcome != "not_injected"]
    injected = [s for s in rows if s.victim is not None]
    detected = [s for s in injected if s.outcome == "detected"]
    judged = [s for s in injected if s.exact_rank is not None]
    clean_steps = sum(s.clean_steps for s in rows)
    fps = sum(s.clean_findings for s in rows)
    return {
        "trials": len(rows),
        "injected": len(injected),
        "clean_controls": len(rows) - len(injected),
        "detected": len(detected),
        "errors": sum(s.error is not None for s in rows),
        "not_injected": len(every) - len(rows),
        "precision": _ratio(sum(s.true_claims for s in rows), sum(s.named_claims for s in rows)),
        "recall": _ratio(len(detected), len(injected)),
        "exact_rank": _ratio(sum(bool(s.exact_rank) for s in judged), len(judged)),
        "ttv_s": _spread([s.ttv_s for s in detected if s.ttv_s is not None]),
        "ttv_steps": _spread([float(s.ttv_steps) for s in detected if s.ttv_steps is not None]),
        "clean_steps": clean_steps,
        "clean_findings": fps,
        "fp_per_1k_clean_steps": None if clean_steps == 0 else 1000.0 * fps / clean_steps,
    }
