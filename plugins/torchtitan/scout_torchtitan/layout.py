"""The job's mesh layout and peer groups, read off TorchTitan's ``ParallelDims``.

Contract: TorchTitan 0.3 unflattens one world mesh in the fixed order ``pp, dp_replicate, dp_shard,
cp, tp`` (``tp`` fastest): :data:`DENSE_ORDER`, ``e`` = 1; replay compares across ``dp_replicate``.
:func:`titan_layout` refuses any enabled mesh of this rank that differs; expert replica groups
overlap the dense axes (:func:`expert_replica_groups`). docs/torchtitan.md, "What attaches where".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scout_core import Axis, MeshLayout, UnsupportedSetupError

__all__ = [
    "DENSE_ORDER",
    "MESH_AXES",
    "TitanLayout",
    "expert_replica_groups",
    "mesh_coordinates",
    "mesh_layout",
    "titan_layout",
]

DENSE_ORDER = "tp-cp-dp_shard-dp_replicate-pp"
"""TorchTitan's dense unflatten order, fastest axis first (``MeshLayout.from_order``)."""

MESH_AXES: dict[str, tuple[Axis, ...]] = {
    "pp": (Axis.P,),
    "dp_replicate": (Axis.D,),
    "dp_shard": (Axis.S,),
    "fsdp": (Axis.S, Axis.C),
    "cp": (Axis.C,),
    "tp": (Axis.T,),
    "batch": (Axis.D, Axis.S),
    "dp": (Axis.D, Axis.S),
    "loss": (Axis.D, Axis.S, Axis.C),
}
"""Every dense TorchTitan mesh name (all three backends) and the layout axes it spans."""


@dataclass(frozen=True)
class TitanLayout:
    """What one rank needs to know about the job's parallel layout."""

    rank: int
    layout: MeshLayout
    """Dense layout: d = dp_replicate, s = dp_shard, t = tp, p = pp, c = cp, e = 1."""
    dense_replicas: tuple[int, ...]
    """This rank's ``loss`` mesh: ranks holding the same full dense weights."""
    expert_replicas: tuple[int, ...] | None
    """This rank's ``dp_replicate`` x ``efsdp`` group (same experts); None without EP."""
    coordinates: dict[str, int] = field(default_factory=dict)
    spmd_backend: str = "spmd_types"


def mesh_layout(parallel_dims: Any) -> MeshLayout:
    """The dense :class:`MeshLayout` of a TorchTitan job (pure arithmetic, no group)."""
    pd = parallel_dims
    layout = MeshLayout.from_order(
        DENSE_ORDER,
        tp=pd.tp,
        cp=pd.cp,
        dp_shard=pd.dp_shard,
        dp_replicate=pd.dp_replicate,
        pp=pd.pp,
    )
    if layout.world_size != pd.world_size:
        raise UnsupportedSetupError(
            f"TorchTitan ParallelDims covers {layout.world_size} ranks "
            f"(pp={pd.pp} dp_replicate={pd.dp_replicate} dp_shard={pd.dp_shard} cp={pd.cp} "
            f"tp={pd.tp}) but the job has {pd.world_size}"
        )
    return layout


def _efsdp(parallel_dims: Any) -> int:
    pd = parallel_dims
    return int(pd.dp_shard * pd.cp * pd.tp // pd.ep)


def _expert_view(parallel_dims: Any) -> MeshLayout:
    """The expert view ``pp, dp_replicate, efsdp, ep`` as a layout (efsdp in ``s``, ep in ``e``)."""
    pd = parallel_dims
    return MeshLayout.from_order("e-s-d-p", e=pd.ep, s=_efsdp(pd), d=pd.dp_replicate, p=pd.pp)


def expert_replica_groups(parallel_dims: Any) -> list[tuple[int, ...]]:
    """Every expert replica group (``dp_replicate`` x ``efsdp`` at fixed ``ep``, ``pp``)."""
    if parallel_dims.ep <= 1:
        return []
    return _expert_view(parallel_dims).groups((Axis.D, Axis.S))


def mesh_coordinates(parallel_dims: Any) -> dict[str, int]:
    """This rank's ``get_local_rank()`` on every enabled one-dimensional mesh."""
    meshes = parallel_dims.get_all_one_dimensional_meshes()
    return {str(name): int(mesh.get_local_rank()) for name, mesh in sorted(meshes.items())}


def _mesh_ranks(mesh: Any) -> tuple[int, ...]:
    return tuple(int(r) for r in mesh.mesh.flatten().tolist())


def _check(name: str, mesh: Any, want: tuple[int, ...], coord: int | None, rank: int) -> None:
    got = _mesh_ranks(mesh)
    if got != want or (coord is not None and int(mesh.get_local_rank()) != coord):
        raise UnsupportedSetupError(
            f"TorchTitan mesh {name!r} of rank {rank} holds ranks {got} "
            f"(local rank {mesh.get_local_rank()}), but the layout derived from "
            f"ParallelDims gives {want} (local rank {coord}); this TorchTitan orders "
            "its meshes differently from 0.3, which scout-torchtitan supports"
        )


def _position(layout: MeshLayout, rank: int, axes: tuple[Axis, ...]) -> int:
    """Row-major index of ``rank`` within its group along ``axes`` (last axis fastest)."""
    address = layout.address(rank)
    # Fastest axis first, as in TorchTitan's flattened meshes (fsdp = dp_shard * cp_size + cp).
    order = [a for a in layout.order if a in axes]
    pos, stride = 0, 1
    for axis in order:
        pos += address.get(axis) * stride
        stride *= layout.size(axis)
    return pos


def titan_layout(parallel_dims: Any, rank: int | None = None) -> TitanLayout:
    """The layout, peer groups and coordinates of ``rank`` (default: this rank), each enabled
    mesh checked against the layout. Needs the meshes built (``parallel_dims.world_mesh``)."""
    import torch.distributed as dist

    pd = parallel_dims
    me = dist.get_rank() if rank is None else rank
    layout = mesh_layout(pd)
    for name, axes in MESH_AXES.items():
        try:
            mesh = pd.get_optional_mesh(name)
        except ValueError:  # not a mesh name under this spmd_backend
            continue
        if mesh is None:
            continue
        want = layout.group_along(me, axes)
        _check(name, mesh, want, _position(layout, me, axes), me)
    expert: tuple[int, ...] | None = None
    if pd.ep > 1:
        view = _expert_view(pd)
        for name, axis in (("ep", Axis.E), ("efsdp", Axis.S)):
            mesh = pd.get_optional_mesh(name)
            if mesh is not None:
                _check(name, mesh, view.group_along(me, (axis,)), view.address(me).get(axis), me)
        expert = view.group_along(me, (Axis.D, Axis.S))
    return TitanLayout(
        rank=me,
        layout=layout,
        dense_replicas=layout.group_along(me, (Axis.D, Axis.S, Axis.C)),
        expert_replicas=expert,
        coordinates=mesh_coordinates(pd),
        spmd_backend=str(pd.spmd_backend),
    )
