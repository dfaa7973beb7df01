"""The job's wait-for graph at a stall: who waits for whom, and the roots nobody-behind waits for.

A vote needs a strict majority of equivalent ranks; a hang does not. A rank that waits
inside a collective waits *for* the members of that collective's group that have not
entered it, so the asymmetry that names the culprit exists even in a pair of replicas.
Every observer builds the same graph from the positions every rank published (its step,
op id, stage and pending collective, gathered at the stall only), with one rule for an
edge ``w -> c`` (:func:`may_wait_for`), ``w`` sitting in code that may block in a
collective (a layer, the optimizer, a collective) and ``c`` not past it:

1. ``w``'s pending collective names its members (an aligned group, point-to-point):
   ``w`` waits for each member that is not inside the same operation with it;
2. its members are unknown (a collective SCOUT's patch does not see: DTensor and other
   functional collectives, C++ reducers, NCCL inside a kernel): ``w`` may wait for any
   rank of its own model instance that is at an earlier step, or at the same step outside
   any collective (idle, the DataLoader, checkpoint I/O) or inside one too;
3. beside it, a peer group whose vote found no strict majority (a pair) adds ``w -> c``
   for a peer ``c`` strictly behind ``w`` (``w`` idle or inside, its collective's members
   unknown): equivalent ranks run the same program, so the rank behind has not reached
   the point where the one ahead waits, and never waits for it.

A rank outside any collective never waits: stopped in compute, in the DataLoader, in
checkpoint I/O, or frozen before a collective. The **roots** are the sink components of
the graph (:meth:`WaitForGraph.roots_of`): a single rank there is the culprit; two or more
ranks that may each wait for the other cannot be told apart, and are never named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scout_core.observer.record import Stage
from scout_core.topology.mesh import MeshLayout, parse_axis

__all__ = ["INSIDE", "OUTSIDE", "Position", "WaitForGraph", "may_wait_for", "same_instance"]

OUTSIDE = frozenset({Stage.IDLE, Stage.DATALOADER, Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE})
"""Stages in which a rank issues no collective (SCOUT's publishers mark them)."""
INSIDE = frozenset({Stage.LAYER, Stage.OPTIMIZER, Stage.COLLECTIVE})
"""Stages in which a rank may sit inside a collective, seen or not."""
_MAY_WAIT = INSIDE | {Stage.IDLE}
"""Stages of a rank ahead of its pair that may wait for it: ``idle`` is also what a rank
publishes on leaving a collective it saw, so it may sit in one it does not see."""


@dataclass(frozen=True)
class Position:
    """A rank's last published position, as the graph reads it."""

    rank: int
    step: int
    stage: Stage | None
    op_id: int = -1
    pending: Mapping[str, Any] = field(default_factory=dict)
    """``describe`` of the pending collective's fingerprint (empty outside one)."""
    members: tuple[int, ...] | None = None
    """The global ranks of the pending collective, where its record names them."""
    operation: tuple[Any, ...] | None = None
    """What identifies the pending operation across its members (equal: the same one)."""

    def members_in(self, layout: MeshLayout | None) -> tuple[int, ...] | None:
        """The members, from the record or from the group axes its pending entry names."""
        if self.members is not None:
            return self.members
        group = str(self.pending.get("group", ""))
        if self.stage is not Stage.COLLECTIVE or layout is None or not group:
            return None
        try:
            axes = [parse_axis(a) for a in group.split("+")]
        except ValueError:  # "p2p", "other", "ranks": not recoverable from the name
            return None
        return layout.group_along(self.rank, axes)


def same_instance(layout: MeshLayout, a: int, b: int) -> bool:
    """Whether ``a`` and ``b`` belong to one model instance (equal peer coordinates)."""
    try:
        pa, pb = layout.address(a), layout.address(b)
    except ValueError:
        return False
    return all(pa.get(ax) == pb.get(ax) for ax in layout.axes_for("peer"))


def may_wait_for(layout: MeshLayout | None, w: Position, c: Position) -> bool:
    """The edge rule (module note, items 1 and 2)."""
    if w.rank == c.rank or w.stage not in INSIDE:
        return False
    if c.step > w.step:
        return False  # c is past w's step: it has entered whatever w waits in
    members = w.members_in(layout)
    if members is not None:
        together = w.operation is not None and w.operation == c.operation
        return c.rank in members and not together
    if layout is None or not same_instance(layout, w.rank, c.rank):
        return False
    return c.step < w.step or c.stage in OUTSIDE or c.stage in INSIDE


class WaitForGraph:
    """The graph over ``positions`` (module doc). ``behind`` adds the peer-order edges of
    item 3: pairs ``(w, c)`` where ``c`` is a peer strictly behind ``w`` in a group with
    no strict majority. ``absent`` ranks have no position and wait for nobody."""

    def __init__(
        self,
        positions: Iterable[Position],
        layout: MeshLayout | None,
        *,
        behind: Iterable[tuple[int, int]] = (),
        absent: Iterable[int] = (),
    ) -> None:
        self.positions = {p.rank: p for p in positions}
        self.absent = frozenset(absent) - set(self.positions)
        self.layout = layout
        nodes = sorted(self.positions)
        self.edges: dict[int, set[int]] = {r: set() for r in (*nodes, *sorted(self.absent))}
        for w in nodes:
            pw = self.positions[w]
            members = pw.members_in(layout)
            for r in self.absent:
                if members is not None and r in members:
                    self.edges[w].add(r)
            for c in nodes:
                if may_wait_for(layout, pw, self.positions[c]):
                    self.edges[w].add(c)
        for w, c in behind:
            ahead = self.positions.get(w)
            if ahead is None or ahead.stage not in _MAY_WAIT or c not in self.edges:
                continue
            if ahead.members_in(layout) is None:  # a known collective says whom it waits for
                self.edges[w].add(c)
        self._component = self._components()

    def _components(self) -> dict[int, frozenset[int]]:
        """Each node's strongly connected component (Tarjan, iterative)."""
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        stack: list[int] = []
        on: set[int] = set()
        out: dict[int, frozenset[int]] = {}
        counter = 0
        for start in sorted(self.edges):
            if start in index:
                continue
            work = [(start, iter(sorted(self.edges[start])))]
            index[start] = low[start] = counter
            counter += 1
            stack.append(start)
            on.add(start)
            while work:
                v, it = work[-1]
                nxt = next(it, None)
                if nxt is not None:
                    if nxt not in index:
                        index[nxt] = low[nxt] = counter
                        counter += 1
                        stack.append(nxt)
                        on.add(nxt)
                        work.append((nxt, iter(sorted(self.edges[nxt]))))
                    elif nxt in on:
                        low[v] = min(low[v], index[nxt])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp: set[int] = set()
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.add(x)
                        if x == v:
                            break
                    frozen = frozenset(comp)
                    for x in comp:
                        out[x] = frozen
        return out

    def stalled(self, rank: int) -> tuple[int, ...] | None:
        """The members of ``rank``'s pending collective when every one of them sits inside
        that same operation (nobody behind: the collective itself is stuck), else None."""
        p = self.positions.get(rank)
        members = None if p is None else p.members_in(self.layout)
        if p is None or p.operation is None or members is None or len(members) < 2:
            return None
        inside = all(
            m in self.positions and self.positions[m].operation == p.operation for m in members
        )
        return tuple(sorted(members)) if inside else None

    def component(self, rank: int) -> frozenset[int]:
        return self._component[rank]

    def is_sink(self, rank: int) -> bool:
        """Whether ``rank``'s component waits for nobody outside itself."""
        comp = self._component[rank]
        return all(c in comp for r in comp for c in self.edges[r])

    def roots_of(self, ranks: Iterable[int]) -> list[frozenset[int]]:
        """The sink components reachable from ``ranks`` (a sink reaches itself)."""
        seen: set[int] = set()
        todo = [r for r in ranks if r in self.edges]
        found: dict[frozenset[int], None] = {}
        while todo:
            r = todo.pop()
            if r in seen:
                continue
            seen.add(r)
            if self.is_sink(r):
                found[self._component[r]] = None
                continue
            todo.extend(sorted(self.edges[r]))
        return sorted(found, key=min)

    def waiters(self, root: int) -> list[int]:
        """Every rank whose only root is ``{root}``: it waits for it, directly or not."""
        return sorted(
            r for r in self.edges if r != root and self.roots_of([r]) == [frozenset({root})]
        )

    def chain(self, start: int, root: int) -> list[int]:
        """A shortest path of waits from ``start`` to ``root`` (for the evidence)."""
        prev: dict[int, int] = {start: start}
        frontier = [start]
        while frontier and root not in prev:
            nxt: list[int] = []
            for r in frontier:
                for c in sorted(self.edges[r]):
                    if c not in prev:
                        prev[c] = r
                        nxt.append(c)
            frontier = nxt
        if root not in prev:
            return []
        path = [root]
        while path[-1] != start:
            path.append(prev[path[-1]])
        return path[::-1]


def peer_order(
    group: Sequence[int], coordinates: Mapping[int, tuple[int, int]]
) -> list[tuple[int, int]]:
    """The item-3 pairs ``(ahead, behind)`` of one peer group with no strict majority."""
    return [
        (w, c)
        for w in group
        for c in group
        if w in coordinates and c in coordinates and coordinates[c] < coordinates[w]
    ]
