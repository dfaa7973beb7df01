"""Timing pools of replay rounds: which ranks replay equal work, and their one exchange.

Contract: the layout and the schedule alone say which ranks replay the same work in a
hidden-layer, embedding or LM-head round (:mod:`scout_core.decision.pools`); every other recipe,
and every round under context or expert parallelism, keeps its peer group.
:meth:`TimingPools.create` is one all-gather on SCOUT's job-wide group that checks every rank's
schedule, so a pool never strands a member, and makes each pool's group and its referee group
(:mod:`.referee`). Where a pool is wider than the peer group, :meth:`TimingPools.exchange` is
one all-gather per round of that kind on the pool's own group (never ``WORLD``, never a
training group), run by every member, ready or not: each member's work key, ``t_M`` and
referee flag. docs/replay.md, "Timing pools: equal work, not equal values".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from scout_core.decision.agreement import all_gather_single
from scout_core.decision.c3 import Surface, exchange
from scout_core.decision.pools import PoolTiming
from scout_core.replay.schedule import EMBEDDING, HIDDEN, LM_HEAD, Recipe, Schedule
from scout_core.topology.groups import diagnostic_groups
from scout_core.topology.mesh import Axis, MeshLayout
from scout_core.vocabulary import Mode

__all__ = ["POOLED", "TimingPools", "pool_axes"]

POOLED: tuple[str, ...] = (HIDDEN, EMBEDDING, LM_HEAD)
"""Recipe kinds whose ``t_M`` is judged over a pool wider than the peer group."""


def pool_axes(layout: MeshLayout, kind: str, *, stages: bool) -> tuple[Axis, ...]:
    """The axes a ``kind`` round's pool varies (docs/replay.md); the peer group's alone when
    nothing wider replays equal work."""
    peer = layout.axes_for("peer")
    if kind not in POOLED or layout.size(Axis.C) > 1 or layout.size(Axis.E) > 1:
        return peer
    axes = {*peer, Axis.D, Axis.S, Axis.T}
    if stages and kind == HIDDEN:
        axes.add(Axis.P)
    wider = tuple(a for a in (Axis.D, Axis.S, Axis.T, Axis.P) if a in axes)
    if all(layout.size(a) == 1 for a in wider if a not in peer):
        return peer  # the same ranks: no wider pool
    return wider


def _row(schedule: Schedule) -> list[int]:
    """This rank's schedule for each pooled kind: on, interval, phase, rotation length."""
    out: list[int] = []
    lengths = {t.kind: len(t.targets) for t in schedule.tracks}
    for kind in POOLED:
        on = kind in lengths
        out += [
            int(on),
            schedule.intervals.get(kind, 0) if on else 0,
            schedule.phases.get(kind, 0) if on else 0,
            lengths.get(kind, 0),
        ]
    return out


@dataclass(frozen=True)
class _Pool:
    ranks: tuple[int, ...]
    pg: dist.ProcessGroup
    referee_pg: dist.ProcessGroup | None = None


class TimingPools:
    """This rank's timing pool per recipe kind, where it is wider than the peer group."""

    def __init__(self, pools: Mapping[str, _Pool], kappa: float) -> None:
        self.pools = dict(pools)
        self.kappa = kappa

    @classmethod
    def create(
        cls,
        layout: MeshLayout,
        rank: int,
        schedule: Schedule,
        job: dist.ProcessGroup,
        *,
        kappa: float,
        referee_timeout_s: float | None = None,
    ) -> TimingPools:
        """Check every rank's schedule and make the pools' groups. Collective over the job: one
        all-gather, then the same groups in the same order everywhere. With
        ``referee_timeout_s``, each pool also gets a referee group with that timeout."""
        mine = torch.tensor(_row(schedule), dtype=torch.int64)
        world = layout.world_size
        table = torch.empty(world * mine.numel(), dtype=torch.int64)
        all_gather_single()(table, mine, group=job)
        rows = {r: tuple(table.view(world, -1)[i].tolist()) for i, r in enumerate(layout.ranks)}
        peer = layout.axes_for("peer")
        made: dict[tuple[Axis, ...], _Pool] = {}
        pools: dict[str, _Pool] = {}
        for j, kind in enumerate(POOLED):
            axes = _agreed(layout, rows, kind, j)
            if axes is None or axes == peer:
                continue
            if axes not in made:
                partition = layout.groups(axes)
                members = next(g for g in partition if rank in g)
                pg = diagnostic_groups(partition)
                referee = None
                if referee_timeout_s is not None:
                    timeout = timedelta(seconds=referee_timeout_s)
                    referee = diagnostic_groups(partition, timeout=timeout)
                made[axes] = _Pool(members, pg, referee)
            pools[kind] = made[axes]
        return cls(pools, kappa)

    def ranks_for(self, recipe: Recipe) -> tuple[int, ...] | None:
        """The pool of ``recipe``'s rounds, when it is wider than the peer group."""
        pool = self.pools.get(recipe.kind)
        return None if pool is None else pool.ranks

    def referee_group(self, recipe: Recipe) -> dist.ProcessGroup | None:
        """The referee group of ``recipe``'s pool, when it has one."""
        pool = self.pools.get(recipe.kind)
        return None if pool is None else pool.referee_pg

    def exchange(
        self, recipe: Recipe, key: int | None, t_m: float | None, *, asking: bool = False
    ) -> PoolTiming | None:
        """Every pool member's work key, ``t_M`` and referee flag for this round. Collective
        over the pool; None where the kind has no wider pool."""
        pool = self.pools.get(recipe.kind)
        if pool is None:
            return None
        # Named by kind, not module path: pipeline stages name the same block differently,
        # and the exchange's header must agree on every member.
        surfaces = [
            Surface(f"pool/{recipe.kind}/work", Mode.EXACT, key),
            Surface(f"pool/{recipe.kind}/t_M", Mode.STATISTICAL, t_m),
            Surface(f"pool/{recipe.kind}/referee", Mode.EXACT, int(asking)),
        ]
        found = exchange(surfaces, group=pool.pg, ranks=pool.ranks, kappa=self.kappa)
        keys = found[f"pool/{recipe.kind}/work"].evidence
        times = found[f"pool/{recipe.kind}/t_M"].evidence
        flags = found[f"pool/{recipe.kind}/referee"].evidence
        return PoolTiming(
            pool.ranks,
            tuple(k if isinstance(k, int) else None for k in keys),
            tuple(t if isinstance(t, float) else None for t in times),
            tuple(f == 1 for f in flags),
        )


def _agreed(
    layout: MeshLayout, rows: Mapping[int, Sequence[int]], kind: str, j: int
) -> tuple[Axis, ...] | None:
    """The widest axes of ``kind``'s pool within which every rank's schedule of ``kind``
    agrees (pipeline stages first, then without them); None when the kind is off here."""
    part = slice(4 * j, 4 * j + 4)
    if not any(row[part][0] for row in rows.values()):
        return None
    for stages in (True, False):
        axes = pool_axes(layout, kind, stages=stages)
        if all(len({tuple(rows[r][part]) for r in group}) == 1 for group in layout.groups(axes)):
            return axes
    return layout.axes_for("peer")
