"""Who waits for whom: a peer group's hang verdicts checked against the ranks it waits on.

Contract: :func:`resolve` (one peer group) and :func:`merge` (the job) are pure functions of
data every observer holds, so every observer reaches the same records. A rank behind inside
a collective is a ``protocol_mismatch`` when it departs from its peers at the same op id, a
``group_stall`` when every member is inside the same operation, else a wait attached to the
verdict naming those it waits for. Docs: docs/observer.md, "The wait-for graph".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scout_core.observer.fingerprint import describe
from scout_core.observer.mismatch import name_mismatches
from scout_core.observer.progress import Stage
from scout_core.observer.roots import attach_direct_waiters, name_roots, release_held
from scout_core.observer.verdict import RankEvidence, Verdict
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure, Scope, Status

__all__ = ["GroupResult", "Stall", "Wait", "merge", "resolve"]

_P2P_CODE = 16
_PROGRESS = frozenset({Failure.HANG, Failure.INPUT_STALL, Failure.CHECKPOINT_STALL})


@dataclass(frozen=True)
class Wait:
    """``rank`` sits in a collective and waits for ``waits_for`` (outside its peer group)."""

    rank: int
    waits_for: tuple[int, ...]
    step: int
    pending: dict[str, Any] = field(default_factory=dict)
    absent: tuple[int, ...] = ()
    """Waited-for ranks whose observers did not answer."""
    quiet: bool = True
    """Every waited-for rank is silent too (else the waiter is only slow, and says nothing)."""


@dataclass(frozen=True)
class Stall:
    """Every member of a collective sits inside it: the collective itself is stalled."""

    members: tuple[int, ...]
    step: int
    pending: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupResult:
    """One peer group's verdicts after resolution, its waits and the stalls it found."""

    group: tuple[int, ...]
    lead: int
    """The group's lowest present rank: its observer writes the group's records."""
    verdicts: tuple[Verdict, ...] = ()
    waits: tuple[Wait, ...] = ()
    stalls: tuple[Stall, ...] = ()
    evidence: tuple[RankEvidence, ...] = ()
    """The present members' evidence; their union over groups is the job's wait-for graph."""

    def to_json(self) -> dict[str, Any]:
        return {
            "group": list(self.group),
            "lead": self.lead,
            "verdicts": [v.to_json() for v in self.verdicts],
            "waits": [
                [w.rank, list(w.waits_for), w.step, w.pending, list(w.absent), w.quiet]
                for w in self.waits
            ],
            "stalls": [[list(s.members), s.step, s.pending] for s in self.stalls],
            "evidence": [e.to_json() for e in self.evidence],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupResult:
        return cls(
            tuple(data["group"]),
            int(data["lead"]),
            tuple(Verdict.from_json(v) for v in data["verdicts"]),
            tuple(
                Wait(int(r), tuple(f), int(s), dict(p), tuple(a), bool(q))
                for r, f, s, p, a, q in data["waits"]
            ),
            tuple(Stall(tuple(m), int(s), dict(p)) for m, s, p in data["stalls"]),
            tuple(RankEvidence.from_json(e) for e in data.get("evidence", ())),
        )


def _same_operation(a: RankEvidence, b: RankEvidence) -> bool:
    """Whether ``a`` and ``b`` sit in the same pending operation (each names the other
    as its partner for point-to-point; equal fingerprints otherwise)."""
    if a.stage != Stage.COLLECTIVE or b.stage != Stage.COLLECTIVE:
        return False
    if a.fingerprint[0] >> 48 == _P2P_CODE:
        return (
            b.fingerprint[0] >> 48 == _P2P_CODE
            and a.fingerprint[2] == b.fingerprint[2]
            and a.peer == b.rank
            and b.peer == a.rank
        )
    return a.fingerprint == b.fingerprint


Lookup = Callable[[int], RankEvidence | None]
Members = Callable[[RankEvidence], tuple[int, ...] | None]


def _explain(
    e: RankEvidence,
    *,
    group: Sequence[int],
    table: Mapping[int, RankEvidence],
    members_of: Members,
    lookup: Lookup,
    min_quiet_s: float,
) -> Wait | Stall | None:
    """Why ``e`` (inside a collective) waits; None when its collective stays in the group."""
    members = members_of(e)
    if members is None or e.rank not in members:
        return None
    outside = [r for r in members if r not in group]
    if not outside:
        return None  # the collective is among the peers: the C3 verdict stands
    others = [r for r in members if r != e.rank]
    found = {r: table[r] if r in table else lookup(r) for r in others}
    absent = tuple(r for r, ev in found.items() if ev is None)
    pending = describe(e.fingerprint)
    if absent:
        return Wait(e.rank, absent, e.step, pending, absent, True)
    present = {r: ev for r, ev in found.items() if ev is not None}
    if all(_same_operation(e, ev) for ev in present.values()):
        return Stall(tuple(sorted(members)), e.step, pending)
    waits = tuple(r for r, ev in present.items() if not _same_operation(e, ev))
    quiet = all(present[r].quiet_s >= min_quiet_s for r in waits)
    return Wait(e.rank, waits, e.step, pending, (), quiet)


def resolve(
    group: Sequence[int],
    lead: int,
    evidence: Sequence[RankEvidence],
    verdicts: Sequence[Verdict],
    *,
    history: Mapping[int, tuple[Status, tuple[int, int, int] | None]],
    members_of: Members,
    lookup: Lookup,
    min_quiet_s: float,
) -> GroupResult:
    """One peer group's verdicts, checked against whom its silent ranks wait for.

    ``verdicts`` is what :func:`~.verdict.decide_round` made of ``evidence``. ``history``
    maps a rank behind inside a collective to exact C3 of its pending fingerprint against
    its peers' at the same op id (``ATTRIBUTED``: it deviates). ``members_of`` and
    ``lookup`` give a pending collective's members and an outside rank's evidence (None:
    unknown, or its observer is absent)."""
    group = tuple(group)
    table = {e.rank: e for e in evidence}
    out: list[Verdict] = []
    waits: list[Wait] = []
    stalls: list[Stall] = []
    for v in verdicts:
        if v.failure in _PROGRESS and v.status is Status.ATTRIBUTED:
            named: list[int] = []
            for r in v.outliers:
                e = table.get(r)  # None: an absent rank the round named as unresponsive
                if e is None or v.detail.get("position", {}).get(str(r)) != "behind":
                    named.append(r)
                    continue
                if e.stage == Stage.COLLECTIVE:
                    status, expected = history.get(r, (Status.INCONCLUSIVE, None))
                    if status is Status.ATTRIBUTED:
                        detail = {**v.detail, "expected": {str(r): describe(expected or (0, 0, 0))}}
                        out.append(
                            Verdict(
                                Failure.PROTOCOL_MISMATCH,
                                "collective",
                                Status.ATTRIBUTED,
                                (r,),
                                Scope.RANK,
                                v.step,
                                detail,
                            )
                        )
                        continue
                why = _explain(
                    e,
                    group=group,
                    table=table,
                    members_of=members_of,
                    lookup=lookup,
                    min_quiet_s=min_quiet_s,
                )
                if isinstance(why, Wait):
                    waits.append(why)
                elif isinstance(why, Stall):
                    stalls.append(why)
                else:
                    named.append(r)
            if named:
                out.append(replace(v, outliers=tuple(named)))
            continue
        if v.failure is Failure.GROUP_STALL and all(e.stage == Stage.COLLECTIVE for e in evidence):
            found = [
                _explain(
                    e,
                    group=group,
                    table=table,
                    members_of=members_of,
                    lookup=lookup,
                    min_quiet_s=min_quiet_s,
                )
                for e in evidence
            ]
            if all(f is not None for f in found):
                waits.extend(f for f in found if isinstance(f, Wait))
                stalls.extend(f for f in found if isinstance(f, Stall))
                continue
        out.append(v)
    return GroupResult(group, lead, tuple(out), tuple(waits), tuple(stalls), tuple(evidence))


def _stall_key(s: Stall) -> tuple[str, str]:
    return (str(s.pending.get("collective")), str(s.pending.get("group")))


def merge(
    results: Sequence[GroupResult], *, job: Sequence[int], layout: MeshLayout | None = None
) -> list[tuple[Verdict, int]]:
    """The job's verdicts, each with the rank whose observer writes its record.

    Same-kind stalls become one ``group_stall``; a wait goes under ``detail["waiting"]`` of
    every verdict naming a rank it waits for, or, unexplained on silent ranks, becomes an
    inconclusive ``hang``; then :mod:`.roots` moves held ranks and lists direct waiters."""
    job_ranks = set(job)
    ordered = sorted(results, key=lambda r: r.group)
    decided: list[tuple[Verdict, int]] = []
    for res in ordered:
        decided.extend(
            (v if v.group else replace(v, group=res.group), res.lead) for v in res.verdicts
        )
    decided, stuck = name_roots(decided, ordered, layout, sorted(job_ranks))
    decided = name_mismatches(decided, ordered, layout, sorted(job_ranks))
    stalls: dict[tuple[str, str], list[tuple[Stall, int]]] = {}
    for res in ordered:
        for st in res.stalls:
            stalls.setdefault(_stall_key(st), []).append((st, res.lead))
    waiting_for: dict[tuple[str, str], dict[str, Any]] = {}
    for g in stuck:
        st = Stall(g.members, g.step, g.pending)
        stalls.setdefault(_stall_key(st), []).append((st, g.writer))
        waiting_for.setdefault(_stall_key(st), {}).update(g.waiting)
    for key in sorted(stalls):
        found = stalls[key]
        members = sorted({tuple(st.members) for st, _ in found})
        everyone = tuple(sorted({r for m in members for r in m}))
        stall = Verdict(
            Failure.GROUP_STALL,
            "progress",
            Status.AGREE,
            (),
            Scope.JOB if set(everyone) >= job_ranks else Scope.GROUP,
            min(st.step for st, _ in found),
            {
                "stalled": [list(m) for m in members],
                "pending": found[0][0].pending,
                "reason": "every member of these collectives is inside them and none "
                "completes: a transport or device stall; run device and fabric checks",
                **({"waiting": waiting_for[key]} if waiting_for.get(key) else {}),
            },
            group=everyone,
        )
        decided.append((stall, min(lead for _, lead in found)))
    unique = {(w.rank, w.waits_for): (w, res.lead) for res in ordered for w in res.waits}
    waits = [unique[k] for k in sorted(unique)]
    attached: set[int] = set()
    for i, (v, writer) in enumerate(decided):
        cause = set(v.outliers) if v.outliers else set(v.group)
        held = {
            str(w.rank): {"for": list(w.waits_for), "pending": w.pending}
            for w, _ in waits
            if set(w.waits_for) & cause
        }
        if held:
            waiting = {**v.detail.get("waiting", {}), **held}
            decided[i] = (replace(v, detail={**v.detail, "waiting": waiting}), writer)
            attached |= {int(r) for r in held}
    for w, lead in waits:
        if w.rank in attached or not w.quiet:
            continue
        why = (
            f"observers of ranks {list(w.absent)} did not answer"
            if w.absent
            else f"ranks {list(w.waits_for)} are silent but were not named by their peers"
        )
        unexplained = Verdict(
            Failure.HANG,
            "progress",
            Status.INCONCLUSIVE,
            (),
            Scope.GROUP,
            w.step,
            {
                "reason": f"rank {w.rank} waits in {w.pending.get('collective')} for ranks "
                f"{list(w.waits_for)}; {why}",
                "waiting": {str(w.rank): {"for": list(w.waits_for), "pending": w.pending}},
            },
            group=tuple(sorted({w.rank, *w.waits_for})),
        )
        decided.append((unexplained, lead))
    return attach_direct_waiters(release_held(decided, layout), ordered, layout, sorted(job_ranks))
