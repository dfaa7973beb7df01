"""A protocol mismatch no vote of peers decides: the collective's own members, then the template.

Contract: :func:`name_mismatches`, a pure function of the group results, names the rank of a
pair that departs from the program: by a strict majority of the pending collective's
members when they all sit in it, else by the job's template (what each rank entered at the
same position of its last completed iteration); without one the record stays group scope.
Docs: docs/observer.md, "The wait-for graph".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from scout_core.decision.c3 import decide_exact
from scout_core.observer.fingerprint import describe
from scout_core.observer.progress import Stage
from scout_core.observer.roots import Decided, GroupEvidence, position_of
from scout_core.observer.verdict import RankEvidence, Verdict
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure, Scope, Status

__all__ = ["name_mismatches"]

_P2P_CODES = frozenset({16, 17})

Fingerprint = tuple[int, int, int]


def _by_members(
    group: Sequence[int],
    evidence: Mapping[int, RankEvidence],
    layout: MeshLayout | None,
    job: Sequence[int],
) -> tuple[tuple[int, ...], Fingerprint] | str:
    """(the departing ranks, the majority's fingerprint), or why the members cannot say."""
    for r in group:
        e = evidence.get(r)
        if e is None or e.stage != Stage.COLLECTIVE or e.fingerprint[0] >> 48 in _P2P_CODES:
            continue
        members = position_of(e, layout, job).members
        if members is None:
            continue
        inside = [evidence.get(m) for m in members]
        if any(m is None or m.stage != Stage.COLLECTIVE for m in inside):
            continue
        if any(m.fingerprint[1] != e.fingerprint[1] for m in inside if m is not None):
            continue  # a member sits in a collective on another group: not this one's witness
        fps = [m.fingerprint for m in inside if m is not None]
        res = decide_exact(fps)
        if res.status is Status.ATTRIBUTED:
            expected = next(fp for fp, bit in zip(fps, res.bitmap, strict=True) if not bit)
            return tuple(m for m, bit in zip(members, res.bitmap, strict=True) if bit), expected
        return f"the {len(members)} members of the collective have no strict majority"
    return "no collective whose every member is inside it"


def _by_template(
    group: Sequence[int], evidence: Mapping[int, RankEvidence]
) -> tuple[tuple[int, ...], Fingerprint] | str:
    """The pair's ranks that depart from the job's last agreed iteration (module doc)."""
    present = [evidence[r] for r in group if r in evidence]
    if len(present) != len(group) or any(e.stage != Stage.COLLECTIVE for e in present):
        return "not every rank of the group is inside a collective"
    templates = {e.template for e in present}
    if None in templates:
        return "no completed iteration to compare with yet (no template)"
    if len(templates) != 1:
        return "the ranks' last iterations differ (no agreed template)"
    template = next(iter(templates))
    assert template is not None
    off = tuple(e.rank for e in present if e.fingerprint != template)
    if not off or len(off) == len(present):
        return "every rank or no rank departs from the template"
    return off, template


def _name(fp: Fingerprint) -> str:
    return str(describe(fp)["collective"])


def name_mismatches(
    decided: Decided,
    results: Sequence[GroupEvidence],
    layout: MeshLayout | None,
    job: Sequence[int],
) -> Decided:
    """``decided`` with each inconclusive mismatch decided by a witness (module doc)."""
    evidence = {e.rank: e for res in results for e in res.evidence}
    out: Decided = []
    for v, writer in decided:
        if v.failure is not Failure.PROTOCOL_MISMATCH or v.status is not Status.INCONCLUSIVE:
            out.append((v, writer))
            continue
        found = _by_members(v.group, evidence, layout, job)
        how = "the collective's members"
        if isinstance(found, str):
            why = found
            found = _by_template(v.group, evidence)
            how = "the job's template"
            if isinstance(found, str):
                out.append((replace(v, detail={**v.detail, "graph": f"{why}; {found}"}), writer))
                continue
        culprits, expected = found
        mine = tuple(c for c in culprits if c in v.group)
        if not mine:
            continue  # the departing ranks are another group's: its record names them
        detail = {
            **v.detail,
            "expected": {str(c): describe(expected) for c in mine},
            "reason": f"ranks {list(mine)} entered {_name(evidence[mine[0]].fingerprint)} "
            f"where {how} say {_name(expected)}",
        }
        verdict = Verdict(
            Failure.PROTOCOL_MISMATCH,
            "collective",
            Status.ATTRIBUTED,
            mine,
            Scope.RANK,
            v.step,
            detail,
            v.group,
        )
        out.append((verdict, writer))
    return out
