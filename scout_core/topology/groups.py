"""Process groups for SCOUT's own collectives, one per peer group of a mesh layout.

Contract: each diagnostic group is a new Gloo group, never ``WORLD`` or a framework's, maybe with a
device-backend payload group over the same members; :func:`is_diagnostic` tells them apart. Made
collectively over the job in one fixed order. docs/concepts.md, "Mesh addresses and peer groups".
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from scout_core.errors import ConfigError, UnsupportedSetupError
from scout_core.topology.mesh import Axis, MeshLayout, attribution_scope
from scout_core.vocabulary import Scope

__all__ = [
    "PeerGroup",
    "create_peer_groups",
    "diagnostic_group",
    "diagnostic_groups",
    "group_ranks",
    "is_diagnostic",
]

_DEVICE_BACKENDS = frozenset({"nccl", "xccl", "hccl"})

_created: weakref.WeakSet[dist.ProcessGroup] = weakref.WeakSet()
"""Every process group :func:`diagnostic_group` made in this process."""

# (members, evidence group, payload group) of one kind, as this rank sees it.
_Created = tuple[tuple[int, ...], dist.ProcessGroup, dist.ProcessGroup | None]


@dataclass(frozen=True)
class PeerGroup:
    """This rank's group of one kind and the process group(s) to talk to it on."""

    kind: str
    """``"replica"``, ``"shard"``, or an axis name (``"t"``, ``"p"`` ...)."""
    ranks: tuple[int, ...]
    """Members in ascending global rank; a member's index here is its peer index."""
    pg: dist.ProcessGroup = field(compare=False, repr=False)
    """A new Gloo group over ``ranks`` for metadata and CPU evidence."""
    payload_pg: dist.ProcessGroup | None = field(default=None, compare=False, repr=False)
    """A device-backend group over the same ranks for tensor payloads, if requested."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def scope(self) -> Scope | None:
        """How far a disagreement in this group can point (:func:`attribution_scope`)."""
        return attribution_scope(len(self.ranks))

    def index_of(self, global_rank: int) -> int:
        """Peer index of ``global_rank``; :class:`ValueError` if it is not a member."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"rank {global_rank} is not in {self.kind} group {self.ranks}"
            ) from None


def _kind_label(layout: MeshLayout, kind: str) -> str:
    axes = layout.axes_for(kind)
    if axes == (Axis.D,) and kind.strip().lower() in ("replica", "peer"):
        return "replica"
    if axes == (Axis.S,) and kind.strip().lower() in ("shard", "peer"):
        return "shard"
    return "+".join(a.value for a in axes)


def _check_world(layout: MeshLayout, rank: int) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise UnsupportedSetupError(
            "torch.distributed is not initialised; SCOUT's peer groups need a process group"
        )
    world = dist.get_world_size()
    if layout.ranks != tuple(range(world)):
        raise ConfigError(
            f"mesh layout covers ranks {layout.ranks[0]}..{layout.ranks[-1]} "
            f"({layout.world_size} ranks) but the job has world size {world}"
        )
    if rank != dist.get_rank():
        raise ConfigError(f"rank {rank} does not match this process's rank {dist.get_rank()}")


def create_peer_groups(
    layout: MeshLayout,
    rank: int,
    kinds: Sequence[str] = ("replica",),
    *,
    backend: str = "gloo",
    timeout: timedelta | None = None,
    payload_backend: str | None = None,
) -> dict[str, PeerGroup]:
    """Create this job's diagnostic groups; return ``rank``'s group of each kind, keyed as
    given. Collective: every rank passes the same layout and kinds (:meth:`MeshLayout.axes_for`).
    ``backend`` is a CPU backend, so diagnosis works while the device communicator is stuck;
    ``payload_backend`` adds a second group per peer group for tensor payloads."""
    _check_world(layout, rank)
    if backend.lower() in _DEVICE_BACKENDS:
        raise ConfigError(
            f"backend={backend!r}: the evidence groups must use a CPU backend such as 'gloo'; "
            "use payload_backend for a device-backend group"
        )
    if (
        payload_backend is not None
        and payload_backend.lower() == "nccl"
        and not torch.cuda.is_available()
    ):
        raise UnsupportedSetupError("payload_backend='nccl' needs CUDA, which is not available")

    axes_of = {kind: layout.axes_for(kind) for kind in kinds}  # validates every kind first
    made: dict[tuple[Axis, ...], _Created] = {}
    result: dict[str, PeerGroup] = {}
    for kind in kinds:
        axes = axes_of[kind]
        if axes not in made:
            made[axes] = _create_kind(
                layout,
                rank,
                axes,
                backend=backend,
                timeout=timeout,
                payload_backend=payload_backend,
            )
        members, pg, payload_pg = made[axes]
        result[kind] = PeerGroup(
            kind=_kind_label(layout, kind), ranks=members, pg=pg, payload_pg=payload_pg
        )
    return result


def _create_kind(
    layout: MeshLayout,
    rank: int,
    axes: tuple[Axis, ...],
    *,
    backend: str,
    timeout: timedelta | None,
    payload_backend: str | None,
) -> _Created:
    """Create every group along ``axes`` (all ranks, same order); return ``rank``'s."""
    mine: _Created | None = None
    for members in layout.groups(axes):
        pg = _new_group(members, backend, timeout)
        payload_pg = None
        if payload_backend is not None:
            payload_pg = _new_group(members, payload_backend, timeout)
        if rank in members:
            if pg is None or (payload_backend is not None and payload_pg is None):
                raise UnsupportedSetupError(f"new_group gave rank {rank} no group for {members}")
            mine = (members, pg, payload_pg)
    if mine is None:  # groups partition the layout, and _check_world put rank in it
        raise AssertionError(f"rank {rank} is in no group along {axes}")
    return mine


def _new_group(
    members: tuple[int, ...], backend: str, timeout: timedelta | None
) -> dist.ProcessGroup | None:
    """``dist.new_group``; ``None`` for a non-member (torch returns a sentinel)."""
    pg = dist.new_group(ranks=list(members), backend=backend, timeout=timeout)
    if not isinstance(pg, dist.ProcessGroup):
        return None
    _created.add(pg)
    return pg


def diagnostic_group(
    ranks: Sequence[int] | None = None,
    *,
    backend: str = "gloo",
    timeout: timedelta | None = None,
) -> dist.ProcessGroup:
    """A new SCOUT-owned group over ``ranks`` (default: all), collective like ``dist.new_group``:
    every rank passes the same ``ranks``; a non-member raises :class:`UnsupportedSetupError`."""
    members = tuple(range(dist.get_world_size())) if ranks is None else tuple(ranks)
    if backend.lower() in _DEVICE_BACKENDS:
        raise ConfigError(f"backend={backend!r}: diagnostic groups use a CPU backend such as gloo")
    pg = _new_group(members, backend, timeout)
    if pg is None:
        raise UnsupportedSetupError(
            f"rank {dist.get_rank()} asked for a diagnostic group it is not in: {list(members)}"
        )
    return pg


def diagnostic_groups(
    partition: Sequence[Sequence[int]],
    *,
    backend: str = "gloo",
    timeout: timedelta | None = None,
) -> dist.ProcessGroup:
    """One new SCOUT-owned group per member list of ``partition``; this rank's, else raises
    :class:`UnsupportedSetupError`. Collective: one ``partition`` everywhere (MeshLayout.groups)."""
    mine: dist.ProcessGroup | None = None
    for members in partition:
        pg = _new_group(tuple(members), backend, timeout)
        if pg is not None:
            mine = pg
    if mine is None:
        raise UnsupportedSetupError(f"rank {dist.get_rank()} is in none of the groups {partition}")
    return mine


def group_ranks(group: dist.ProcessGroup) -> tuple[int, ...]:
    """The global ranks of ``group`` in group-rank order (the order its collectives use)."""
    return tuple(int(r) for r in dist.get_process_group_ranks(group))


def is_diagnostic(group: object) -> bool:
    """Whether ``group`` is a process group SCOUT made (never ``WORLD`` or a training group)."""
    return isinstance(group, dist.ProcessGroup) and group in _created and group != dist.group.WORLD
