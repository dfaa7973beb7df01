"""From the wait-for graph to the job's hang verdicts: name the roots, list the waiters.

Contract: pure functions of the group results every observer reads, so every observer
reaches the same records. :func:`name_roots` decides the stalls no vote could;
:func:`release_held` and :func:`attach_direct_waiters` move or list waiting ranks on the
records of the ranks they wait for. Docs: docs/observer.md, "The wait-for graph".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from scout_core.observer.fingerprint import describe
from scout_core.observer.progress import Stage
from scout_core.observer.roles import (
    KIND_PLAIN,
    collective_members,
    decode_group_word,
    plain_group_word,
)
from scout_core.observer.verdict import RankEvidence, Verdict, stall_failure
from scout_core.observer.waitfor import Position, WaitForGraph, peer_order
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure, Scope, Status

__all__ = [
    "GraphStall",
    "GroupEvidence",
    "attach_direct_waiters",
    "name_roots",
    "position_of",
    "release_held",
]

_P2P_CODE = 16
_PROGRESS = frozenset({Failure.HANG, Failure.INPUT_STALL, Failure.CHECKPOINT_STALL})
_STUCK = frozenset({Failure.GROUP_STALL, Failure.INPUT_STALL, Failure.CHECKPOINT_STALL})

Decided = list[tuple[Verdict, int]]


class GroupEvidence(Protocol):
    """What :func:`name_roots` reads of one group's result (:class:`~.resolve.GroupResult`)."""

    @property
    def group(self) -> tuple[int, ...]: ...
    @property
    def verdicts(self) -> tuple[Verdict, ...]: ...
    @property
    def evidence(self) -> tuple[RankEvidence, ...]: ...


def _stage(value: int | str) -> Stage | None:
    try:
        return Stage[value.upper()] if isinstance(value, str) else Stage(value)
    except (KeyError, ValueError):
        return None


def position_of(e: RankEvidence, layout: MeshLayout | None, job: Sequence[int]) -> Position:
    """The graph's view of one rank's round evidence."""
    stage = _stage(e.stage)
    if stage is not Stage.COLLECTIVE:
        return Position(e.rank, e.step, stage, e.op_id)
    fp = e.fingerprint
    members: tuple[int, ...] | None = None
    if layout is not None:
        members = collective_members(layout, e.rank, fp[1], e.peer)
    elif decode_group_word(fp[1])[0] == KIND_PLAIN and fp[1] == plain_group_word(sorted(job)):
        members = tuple(sorted(job))  # the world group, described by its ranks
    p2p = fp[0] >> 48 == _P2P_CODE and e.peer is not None
    operation = ("p2p", fp[2], *sorted((e.rank, e.peer or 0))) if p2p else ("c", *fp)
    return Position(e.rank, e.step, stage, e.op_id, describe(fp), members, operation)


def _inconclusive(v: Verdict) -> bool:
    """A progress verdict that names nobody for want of a majority (or of a second copy)."""
    if v.failure is Failure.HANG and v.status is Status.INCONCLUSIVE:
        return v.surface == "progress"
    return v.failure in _STUCK and v.status is Status.AGREE and len(v.group) == 1


def _entry(graph: WaitForGraph, w: int, root: int) -> dict[str, Any]:
    p = graph.positions[w]
    return {
        "for": [root],
        "via": graph.chain(w, root)[1:],
        "stage": p.stage.name.lower() if p.stage is not None else "unknown",
        "pending": dict(p.pending),
    }


def _how(p: Position) -> str:
    if p.stage is Stage.COLLECTIVE:
        return f"in {p.pending.get('collective')} over {p.pending.get('group')}"
    return f"in {p.stage.name.lower() if p.stage is not None else 'an unknown stage'}"


def _root_verdict(
    graph: WaitForGraph, v: Verdict, root: int, quiet: Mapping[int, float]
) -> Verdict:
    p = graph.positions[root]
    failure, surface = stall_failure(int(p.stage) if p.stage is not None else -1)
    waiters = graph.waiters(root)
    direct = [w for w in waiters if root in graph.edges[w]]
    stage = p.stage.name.lower() if p.stage is not None else "unknown"
    reason = (
        f"rank {root} has made no progress for {quiet.get(root, 0.0):.1f} s ({stage} at step "
        f"{p.step}) and waits for nobody; "
        + "; ".join(f"rank {w} waits for it {_how(graph.positions[w])}" for w in direct)
        + " (wait-for graph)"
    )
    detail = {
        **v.detail,
        "position": {str(root): "behind"},
        "reason": reason,
        "waiting": {str(w): _entry(graph, w, root) for w in waiters},
    }
    return Verdict(
        failure, surface, Status.ATTRIBUTED, (root,), Scope.RANK, p.step, detail, v.group
    )


class GraphStall(NamedTuple):
    """A collective the graph found stuck with every member inside it (no rank named)."""

    members: tuple[int, ...]
    step: int
    pending: dict[str, Any]
    writer: int
    waiting: dict[str, Any]
    """The ranks that wait for it, as ``detail["waiting"]`` lists them."""


def name_roots(
    decided: Decided,
    results: Sequence[GroupEvidence],
    layout: MeshLayout | None,
    job: Sequence[int],
) -> tuple[Decided, list[GraphStall]]:
    """``decided`` with the stalls no vote decided named by the wait-for graph, and the
    collectives found stuck with every member inside (for :func:`~.resolve.merge`)."""
    evidence = {e.rank: e for res in results for e in res.evidence}
    todo = [i for i, (v, _) in enumerate(decided) if _inconclusive(v)]
    if not evidence or not todo:
        return list(decided), []
    behind: list[tuple[int, int]] = []
    for res in results:
        if any(_inconclusive(replace(v, group=v.group or res.group)) for v in res.verdicts):
            coords = {e.rank: (e.step, e.op_id) for e in res.evidence}
            behind += peer_order(res.group, coords)
    graph = WaitForGraph(
        (position_of(e, layout, job) for e in evidence.values()),
        layout,
        behind=behind,
        absent=set(job) - set(evidence),
    )
    quiet = {r: e.quiet_s for r, e in evidence.items()}
    out: Decided = []
    explained: dict[int, list[int]] = {}
    stalls: list[GraphStall] = []
    for i, (v, writer) in enumerate(decided):
        if i not in todo:
            out.append((v, writer))
            continue
        ranks = [r for r in v.group if r in evidence]
        roots = graph.roots_of(ranks)
        singles = [min(c) for c in roots if len(c) == 1 and min(c) in evidence]
        if not roots or len(singles) < len(roots):
            why = _undecided(graph, roots)
            out.append((replace(v, detail={**v.detail, "graph": why}), writer))
            continue
        for root in singles:
            members = graph.stalled(root)
            if members is not None:
                stalls.append(_stall(graph, root, members, writer))
            elif root in v.group:
                out.append((_root_verdict(graph, v, root, quiet), writer))
            else:
                explained.setdefault(root, []).extend(r for r in ranks if r != root)
    return _attach(out, graph, explained), stalls


def _stall(graph: WaitForGraph, root: int, members: tuple[int, ...], writer: int) -> GraphStall:
    """A root in a collective with every member inside: the collective is stuck."""
    inside = set(members)
    waiting: dict[str, Any] = {}
    for r in sorted(graph.edges):
        found = graph.roots_of([r])
        if r in inside or not found or not all(c <= inside for c in found):
            continue
        entry = _entry(graph, r, min(found[0]))
        waiting[str(r)] = {**entry, "for": sorted({m for c in found for m in c})}
    p = graph.positions[root]
    return GraphStall(members, p.step, dict(p.pending), writer, waiting)


def _undecided(graph: WaitForGraph, roots: Sequence[frozenset[int]]) -> str:
    if not roots:
        return "the wait-for graph found no root"
    parts = []
    for comp in roots:
        ranks = sorted(comp)
        if len(ranks) > 1:
            parts.append(
                f"ranks {ranks} may each wait for the other (a collective SCOUT does not see)"
            )
        elif ranks[0] in graph.absent:
            parts.append(f"the observer of rank {ranks[0]}, waited for, did not answer")
    return "the wait-for graph cannot name a root: " + "; ".join(parts)


def _attach(out: Decided, graph: WaitForGraph, explained: Mapping[int, list[int]]) -> Decided:
    """The waiters of groups explained by another group's root, on that root's record."""
    for root, waiters in sorted(explained.items()):
        at = next((i for i, (v, _) in enumerate(out) if v.localized and root in v.outliers), None)
        if at is None:
            continue  # nothing names the root: its own group's record says why
        v, writer = out[at]
        waiting = dict(v.detail.get("waiting", {}))
        for w in waiters:
            waiting.setdefault(str(w), _entry(graph, w, root))
        out[at] = (replace(v, detail={**v.detail, "waiting": waiting}), writer)
    return out


def _named(decided: Sequence[tuple[Verdict, int]]) -> dict[int, tuple[Position, int]]:
    """Ranks named behind their peers (with the record's evidence) and their verdict's index."""
    out: dict[int, tuple[Position, int]] = {}
    for i, (v, _) in enumerate(decided):
        if v.failure not in _PROGRESS or v.status is not Status.ATTRIBUTED:
            continue
        d = v.detail
        for r in v.outliers:
            key = str(r)
            if d.get("position", {}).get(key) != "behind" or key not in d.get("coordinates", {}):
                continue  # an absent or unresponsive rank: no evidence to compare
            stage = _stage(str(d.get("stages", {}).get(key, "")))
            pending = dict(d.get("pending", {}).get(key) or {})
            out[r] = (Position(r, int(d["coordinates"][key][0]), stage, pending=pending), i)
    return out


def release_held(decided: Sequence[tuple[Verdict, int]], layout: MeshLayout | None) -> Decided:
    """``decided`` with each named rank that waits for another named rank moved to the
    records of the roots it waits for (``detail["waiting"]``)."""
    named = _named(decided)
    if layout is None or len(named) < 2:
        return list(decided)
    graph = WaitForGraph((p for p, _ in named.values()), layout)
    held = {r: list(_ranks_in(graph, r)) for r in named if not graph.is_sink(r)}
    out = list(decided)
    for w in sorted(held):
        p = named[w][0]
        entry = {
            "for": held[w],
            "pending": dict(p.pending),
            "stage": p.stage.name.lower() if p.stage is not None else "unknown",
        }
        for root in _ranks_in(graph, w):
            i = named[root][1]
            v, writer = out[i]
            waiting = {**v.detail.get("waiting", {}), str(w): entry}
            out[i] = (replace(v, detail={**v.detail, "waiting": waiting}), writer)
    kept: Decided = []
    for v, writer in out:
        if v.failure in _PROGRESS and v.status is Status.ATTRIBUTED and v.outliers:
            left = tuple(r for r in v.outliers if r not in held)
            if left:
                kept.append((replace(v, outliers=left), writer))
            continue  # a record left naming only held ranks is dropped
        kept.append((v, writer))
    return kept


def _ranks_in(graph: WaitForGraph, w: int) -> Iterable[int]:
    return sorted({r for comp in graph.roots_of([w]) for r in comp})


def attach_direct_waiters(
    decided: Decided,
    results: Sequence[GroupEvidence],
    layout: MeshLayout | None,
    job: Sequence[int],
) -> Decided:
    """``decided`` with each record that names ranks listing, under ``detail["waiting"]``,
    the outside ranks in a collective that a named rank has not entered (edge rule 1;
    existing entries kept), whether or not the waiter's group has voted yet."""
    named = [
        i
        for i, (v, _) in enumerate(decided)
        if v.failure in _PROGRESS and v.status is Status.ATTRIBUTED and v.outliers
    ]
    evidence = {e.rank: e for res in results for e in res.evidence}
    if not named or not evidence:
        return list(decided)
    graph = WaitForGraph(
        (position_of(e, layout, job) for e in evidence.values()),
        layout,
        absent=set(job) - set(evidence),
    )
    out = list(decided)
    for i in named:
        v, writer = out[i]
        waiting = dict(v.detail.get("waiting", {}))
        for w in sorted(graph.edges):
            members = graph.positions[w].members_in(layout) if w in graph.positions else None
            if w in v.group or str(w) in waiting or not members:
                continue
            culprits = sorted(c for c in v.outliers if c in members and c in graph.edges[w])
            if culprits:
                waiting[str(w)] = {**_entry(graph, w, culprits[0]), "for": culprits}
        if waiting != v.detail.get("waiting", {}):
            out[i] = (replace(v, detail={**v.detail, "waiting": waiting}), writer)
    return out
