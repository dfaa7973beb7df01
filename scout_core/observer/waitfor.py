"""The job's wait-for graph at a stall: who waits for whom, and the roots nobody-behind waits for.

Contract: every observer builds the same :class:`WaitForGraph` from the positions gathered
at the stall, with one edge rule; a rank outside any collective waits for nobody. A
single-rank sink component is the culprit; ranks that may each wait for the other are
never named. The edge rule: docs/observer.md, "The wait-for graph".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scout_core.observer.progress import Stage
from scout_core.topology.mesh import AXES, MeshLayout, parse_axis

__all__ = ["INSIDE", "OUTSIDE", "Position", "WaitForGraph"]

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


class WaitForGraph:
    """The graph over ``positions``. ``behind`` adds the edges of rule item 3 (docs): pairs
    ``(w, c)``, ``c`` a peer strictly behind ``w`` in a group with no strict majority.
    ``absent`` ranks wait for nobody. Built in O(ranks x candidates), with the roots each
    component reaches computed once, so every query is cheap at job scale."""

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
        self._members = {r: self.positions[r].members_in(layout) for r in nodes}
        instances = self._instances()
        others: dict[tuple[Any, tuple[int, ...]], list[int]] = {}
        for w in nodes:
            self.edges[w] |= self._waits_for(w, instances, others)
        for w, c in behind:
            ahead = self.positions.get(w)
            if ahead is None or ahead.stage not in _MAY_WAIT or c not in self.edges:
                continue
            if self._members[w] is None:  # a known collective says whom it waits for
                self.edges[w].add(c)
        self._components()
        self._reachable()
        self._hops: dict[int, dict[int, int]] = {}

    def _waits_for(
        self,
        w: int,
        instances: Mapping[int, tuple[int, ...]],
        others: dict[tuple[Any, tuple[int, ...]], list[int]],
    ) -> set[int]:
        """Edge rule items 1 and 2 (docs): whom ``w`` may wait for. ``others`` caches, per
        pending operation, the members not inside it."""
        pw = self.positions[w]
        if pw.stage not in INSIDE:
            return set()
        out: set[int] = set()
        members = self._members[w]
        if members is not None:  # item 1: the members not inside the same operation
            key = (pw.operation, members)
            if key not in others:
                others[key] = [
                    m
                    for m in members
                    if pw.operation is None
                    or m not in self.positions
                    or self.positions[m].operation != pw.operation
                ]
            for c in others[key]:
                pc = self.positions.get(c)
                if pc is None:
                    if c in self.absent:
                        out.add(c)
                elif c != w and pc.step <= pw.step:  # a rank past w's step entered it
                    out.add(c)
            return out
        for c in instances.get(w, ()):  # item 2: anyone of its model instance not past it
            pc = self.positions[c]
            if c == w or pc.step > pw.step:
                continue
            if pc.step < pw.step or pc.stage in OUTSIDE or pc.stage in INSIDE:
                out.add(c)
        return out

    def _instances(self) -> dict[int, tuple[int, ...]]:
        """Each present rank's model instance (the ranks with its peer coordinates)."""
        layout = self.layout
        if layout is None:
            return {}
        peer = set(layout.axes_for("peer"))
        out: dict[int, tuple[int, ...]] = {}
        for group in layout.groups([a for a in AXES if a not in peer]):
            present = tuple(r for r in group if r in self.positions)
            for r in present:
                out[r] = present
        return out

    def _components(self) -> None:
        """Each node's strongly connected component (Tarjan, iterative), numbered in the
        order found: each after every component it reaches."""
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        stack: list[int] = []
        on: set[int] = set()
        self._cid: dict[int, int] = {}
        self._members_of: list[tuple[int, ...]] = []
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
                    comp: list[int] = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        self._cid[x] = len(self._members_of)
                        if x == v:
                            break
                    self._members_of.append(tuple(sorted(comp)))

    def _reachable(self) -> None:
        """The sink components each component reaches (itself, when it is one), by number."""
        interned: dict[frozenset[int], frozenset[int]] = {}
        self._reach: list[frozenset[int]] = []
        for i, comp_members in enumerate(self._members_of):
            succ = {self._cid[c] for r in comp_members for c in self.edges[r]}
            succ.discard(i)
            if not succ:
                found = frozenset({i})
            elif len(succ) == 1:
                found = self._reach[succ.pop()]
            else:
                found = frozenset().union(*(self._reach[t] for t in succ))
            self._reach.append(interned.setdefault(found, found))

    def stalled(self, rank: int) -> tuple[int, ...] | None:
        """The members of ``rank``'s pending collective when every one of them sits inside
        that same operation (nobody behind: the collective itself is stuck), else None."""
        p = self.positions.get(rank)
        members = self._members.get(rank)
        if p is None or p.operation is None or members is None or len(members) < 2:
            return None
        inside = all(
            m in self.positions and self.positions[m].operation == p.operation for m in members
        )
        return tuple(sorted(members)) if inside else None

    def component(self, rank: int) -> frozenset[int]:
        return frozenset(self._members_of[self._cid[rank]])

    def is_sink(self, rank: int) -> bool:
        """Whether ``rank``'s component waits for nobody outside itself."""
        i = self._cid[rank]
        return self._reach[i] == frozenset({i})

    def roots_of(self, ranks: Iterable[int]) -> list[frozenset[int]]:
        """The sink components reachable from ``ranks`` (a sink reaches itself)."""
        found: set[int] = set()
        for r in ranks:
            if r in self._cid:
                found |= self._reach[self._cid[r]]
        return sorted((frozenset(self._members_of[i]) for i in found), key=min)

    def waiters(self, root: int) -> list[int]:
        """Every rank whose only root is ``{root}``: it waits for it, directly or not."""
        only = frozenset({self._cid[root]})
        return sorted(r for r in self.edges if r != root and self._reach[self._cid[r]] == only)

    def next_hops(self, root: int) -> dict[int, int]:
        """For every rank that reaches ``root``, the next rank on a shortest chain of waits
        to it (one backward BFS, kept for :meth:`chain`)."""
        if root in self._hops:
            return self._hops[root]
        into: dict[int, list[int]] = {}
        for w, cs in self.edges.items():
            for c in cs:
                into.setdefault(c, []).append(w)
        hops: dict[int, int] = {root: root}
        frontier = [root]
        while frontier:
            nxt: list[int] = []
            for c in frontier:
                for w in sorted(into.get(c, ())):
                    if w not in hops:
                        hops[w] = c
                        nxt.append(w)
            frontier = nxt
        self._hops[root] = hops
        return hops

    def chain(self, start: int, root: int) -> list[int]:
        """A shortest path of waits from ``start`` to ``root`` (for the evidence)."""
        hops = self.next_hops(root)
        if start not in hops:
            return []
        path = [start]
        while path[-1] != root:
            path.append(hops[path[-1]])
        return path


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
