"""Held up, not hung: a named rank that waits for a hung rank of its own model instance.

Each peer group compares equivalent ranks only (:mod:`.roles`), so a rank that waits
for a hung TP partner (or the previous pipeline stage, a CP or EP partner) is behind
*its* peers too, and its group names it, unless :mod:`.resolve` can see whom it waits
for: that needs the collective it sits in to pass through SCOUT's patch. Framework
collectives the patch does not see (DTensor redistribution and other functional
collectives, C++ reducers) leave the waiter's last published stage at ``layer`` or
``optimizer``, with no members to look up, so both the hung rank and its partner
were named. A tool people trust must not name an innocent rank.

After every group's result is merged, :func:`release_held` checks the named ranks
against each other. A named rank ``w`` is *held* by a named rank ``c`` when:

1. they are in the same model instance: the same coordinates on the peer axes
   (the same data replica), so they share a TP, PP, CP or EP group (the layout says
   which ranks those are);
2. ``w`` may be blocked inside a collective: its stage is ``layer``, ``optimizer``,
   or ``collective`` (an unresolved one whose group, when the record names its axes,
   contains ``c``);
3. ``c`` is strictly earlier: at an earlier step, or at the same step outside any
   code that issues collectives (``idle``, the DataLoader fetch, checkpoint I/O).
   A rank cannot finish a collective its partner never entered, so the earlier rank
   is the one the later one waits for.

A held rank is not named: its wait is attached to the record naming its root cause
(``detail["waiting"][w] = {"for": [...], "pending": {...}, "stage": ...}``, as for the
waits :mod:`.resolve` finds), and a record left naming nobody is dropped. Two silent
ranks of one instance at the same step, both inside compute, stay named: nothing tells
which waits for which. "Earlier" is a strict order, so the roots always stay named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from scout_core.observer.record import Stage
from scout_core.observer.verdict import Verdict
from scout_core.topology.mesh import MeshLayout, parse_axis
from scout_core.vocabulary import Failure, Status

__all__ = ["release_held"]

_PROGRESS = frozenset({Failure.HANG, Failure.INPUT_STALL, Failure.CHECKPOINT_STALL})
_OUTSIDE = frozenset({Stage.IDLE, Stage.DATALOADER, Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE})
"""Stages in which a rank issues no collective (SCOUT's publishers mark them)."""
_INSIDE = frozenset({Stage.LAYER, Stage.OPTIMIZER, Stage.COLLECTIVE})
"""Stages in which a rank may sit inside a collective SCOUT does not see."""


@dataclass(frozen=True)
class _Named:
    rank: int
    stage: Stage | None
    step: int
    pending: dict[str, Any]
    at: int
    """Index of the verdict naming it."""


def _named(decided: Sequence[tuple[Verdict, int]]) -> dict[int, _Named]:
    """Ranks named behind their peers, with the evidence their record carries."""
    out: dict[int, _Named] = {}
    for i, (v, _) in enumerate(decided):
        if v.failure not in _PROGRESS or v.status is not Status.ATTRIBUTED:
            continue
        d = v.detail
        for r in v.outliers:
            key = str(r)
            if d.get("position", {}).get(key) != "behind" or key not in d.get("coordinates", {}):
                continue  # an absent or unresponsive rank: no evidence to compare
            try:
                stage: Stage | None = Stage[str(d.get("stages", {}).get(key, "")).upper()]
            except KeyError:
                stage = None
            step = int(d["coordinates"][key][0])
            out[r] = _Named(r, stage, step, dict(d.get("pending", {}).get(key) or {}), i)
    return out


def _same_instance(layout: MeshLayout, a: int, b: int) -> bool:
    peer_axes = layout.axes_for("peer")
    try:
        pa, pb = layout.address(a), layout.address(b)
    except ValueError:
        return False
    return all(pa.get(ax) == pb.get(ax) for ax in peer_axes)


def _may_wait_for(layout: MeshLayout, w: _Named, c: _Named) -> bool:
    if w.stage not in _INSIDE or not _same_instance(layout, w.rank, c.rank):
        return False
    if w.stage is Stage.COLLECTIVE:
        group = str(w.pending.get("group", ""))
        try:
            axes = [parse_axis(a) for a in group.split("+")] if group else []
        except ValueError:  # "p2p", "other", "ranks": members unknown here
            axes = []
        if axes and c.rank not in layout.group_along(w.rank, axes):
            return False
    if c.step != w.step:
        return c.step < w.step
    return c.stage in _OUTSIDE


def _roots(r: int, causes: dict[int, set[int]]) -> set[int]:
    if r not in causes:
        return {r}
    return {root for c in causes[r] for root in _roots(c, causes)}


def release_held(
    decided: Sequence[tuple[Verdict, int]], layout: MeshLayout | None
) -> list[tuple[Verdict, int]]:
    """``decided`` with every held rank moved from the culprits to its cause's record."""
    named = _named(decided)
    if layout is None or len(named) < 2:
        return list(decided)
    causes: dict[int, set[int]] = {}
    for held in named.values():
        found = {
            c.rank for c in named.values() if c.rank != held.rank and _may_wait_for(layout, held, c)
        }
        if found:
            causes[held.rank] = found
    if not causes:
        return list(decided)
    out = list(decided)
    for w in sorted(causes):
        roots = sorted(_roots(w, causes))
        info = named[w]
        entry = {
            "for": roots,
            "pending": info.pending,
            "stage": info.stage.name.lower() if info.stage is not None else "unknown",
        }
        for root in roots:
            i = named[root].at
            v, writer = out[i]
            waiting = {**v.detail.get("waiting", {}), str(w): entry}
            out[i] = (replace(v, detail={**v.detail, "waiting": waiting}), writer)
    kept: list[tuple[Verdict, int]] = []
    for v, writer in out:
        if v.failure in _PROGRESS and v.status is Status.ATTRIBUTED and v.outliers:
            left = tuple(r for r in v.outliers if r not in causes)
            if not left:
                continue  # it named only ranks held up by others
            kept.append((replace(v, outliers=left), writer))
            continue
        kept.append((v, writer))
    return kept
