"""Mesh addresses: which ranks run equivalent work, and so may be compared.

Contract: a :class:`MeshLayout` maps every global rank to an address ``(d, s, t, p, c, e)``
(unused axes have degree 1) and gives its peer groups, pure arithmetic with no process group:
``G_rep`` varies ``d``, ``G_shard`` varies ``s`` (without a replica axis); ``c`` stays fixed.
:class:`Axis` names the axes once. docs/concepts.md, "Mesh addresses and peer groups".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

import torch

from scout_core.errors import ConfigError
from scout_core.vocabulary import Scope

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "Axis",
    "AXES",
    "AXIS_ALIASES",
    "GROUP_KINDS",
    "parse_axis",
    "MeshAddress",
    "MeshLayout",
    "PeerSpec",
    "attribution_scope",
]


class Axis(str, Enum):
    """A parallelism axis; the value is its :class:`MeshAddress` field. D: data replicas
    (identical state); S: FSDP shards of one replica; T: tensor parallel; P: pipeline stage;
    C: context (sequence) shard; E: expert parallel."""

    D = "d"
    S = "s"
    T = "t"
    P = "p"
    C = "c"
    E = "e"


AXES: Final[tuple[Axis, ...]] = tuple(Axis)
"""All axes in canonical order, the field order of :class:`MeshAddress`."""

AXIS_ALIASES: Final[Mapping[str, Axis]] = MappingProxyType(
    {
        "d": Axis.D,
        "dp": Axis.D,
        "dp_replicate": Axis.D,
        "s": Axis.S,
        "fsdp": Axis.S,
        "dp_shard": Axis.S,
        "shard": Axis.S,
        "t": Axis.T,
        "tp": Axis.T,
        "p": Axis.P,
        "pp": Axis.P,
        "c": Axis.C,
        "cp": Axis.C,
        "e": Axis.E,
        "ep": Axis.E,
    }
)

REPLICA: Final = "replica"
SHARD: Final = "shard"
PEER: Final = "peer"
GROUP_KINDS: Final[tuple[str, ...]] = (REPLICA, SHARD, PEER)
"""Named group kinds; an axis name (``"t"``, ``"tp"`` ...) is also a kind."""


def parse_axis(name: Axis | str) -> Axis:
    """Return the axis a short or framework name means; :class:`ConfigError` if none."""
    if isinstance(name, Axis):
        return name
    try:
        return AXIS_ALIASES[str(name).strip().lower()]
    except KeyError:
        raise ConfigError(
            f"unknown mesh axis {name!r}; valid names: {', '.join(AXIS_ALIASES)}"
        ) from None


def attribution_scope(group_size: int) -> Scope | None:
    """How far a disagreement among ``group_size`` peers can point: one, nowhere (``None``);
    two, the group (not which side); three or more, a rank, if the healthy are a strict majority."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if group_size == 1:
        return None
    if group_size == 2:
        return Scope.GROUP
    return Scope.RANK


@dataclass(frozen=True)
class MeshAddress:
    """A rank's coordinate on every axis; an unused axis has coordinate 0."""

    d: int = 0
    s: int = 0
    t: int = 0
    p: int = 0
    c: int = 0
    e: int = 0

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis.value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"coordinate {axis.value} must be an int >= 0, got {value!r}")

    def get(self, axis: Axis | str) -> int:
        """The coordinate on ``axis`` (any accepted spelling)."""
        value: int = getattr(self, parse_axis(axis).value)
        return value

    def as_tuple(self) -> tuple[int, ...]:
        """Coordinates in canonical order ``(d, s, t, p, c, e)``."""
        return tuple(getattr(self, axis.value) for axis in AXES)


@dataclass(frozen=True)
class PeerSpec:
    """The group a rank is compared in: its kind and its members, by global rank."""

    kind: str
    """``"replica"`` (vary d) or ``"shard"`` (vary s)."""
    ranks: tuple[int, ...]
    """Members in ascending global rank; position in this tuple is the peer index."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def scope(self) -> Scope | None:
        """See :func:`attribution_scope`."""
        return attribution_scope(len(self.ranks))


@dataclass(frozen=True)
class MeshLayout:
    """Sizes of the six axes (canonical order), how ranks are laid out over them, and the peer
    groups. ``order`` lists the axes fastest first, normalised with degree-1 axes last in
    canonical order, so equal layouts compare equal however built. Position ``i`` of the mesh
    (an address's mixed-radix number under ``order``) holds rank ``grid[i]``, or ``i`` if None."""

    sizes: tuple[int, ...]
    order: tuple[Axis, ...] = AXES
    grid: tuple[int, ...] | None = None
    _strides: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _positions: Mapping[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if len(sizes) != len(AXES):
            raise ConfigError(f"sizes must give all six axes (d, s, t, p, c, e), got {sizes}")
        for axis, size in zip(AXES, sizes, strict=True):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(f"size of axis {axis.value!r} must be an int >= 1, got {size!r}")
        order = tuple(parse_axis(a) for a in self.order)
        if sorted(order) != sorted(AXES):
            raise ConfigError(
                f"order must name each of {', '.join(a.value for a in AXES)} once, "
                f"got {', '.join(a.value for a in order)}"
            )
        order = tuple(a for a in order if sizes[AXES.index(a)] > 1) + tuple(
            a for a in AXES if sizes[AXES.index(a)] == 1
        )
        strides = [0] * len(AXES)
        stride = 1
        for axis in order:
            strides[AXES.index(axis)] = stride
            stride *= sizes[AXES.index(axis)]
        world = stride
        grid = None if self.grid is None else tuple(self.grid)
        positions: dict[int, int] = {}
        if grid is not None:
            if len(grid) != world:
                raise ConfigError(f"rank grid has {len(grid)} entries, the axis sizes give {world}")
            for pos, rank in enumerate(grid):
                if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                    raise ConfigError(f"rank grid entries must be ints >= 0, got {rank!r}")
                if rank in positions:
                    raise ConfigError(f"rank {rank} appears twice in the rank grid")
                positions[rank] = pos
            if grid == tuple(range(world)):
                grid, positions = None, {}
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "_strides", tuple(strides))
        object.__setattr__(self, "_positions", MappingProxyType(positions))

    @classmethod
    def from_order(cls, order: str, **sizes: int) -> MeshLayout:
        """Megatron convention: ``from_order("tp-cp-ep-dp-pp", tp=2, dp=4)``, first axis fastest
        (Megatron's TP ranks are contiguous). Sizes take short or framework names; an axis
        without a size has degree 1, one missing from ``order`` varies slowest."""
        axes: list[Axis] = []
        for name in order.split("-"):
            axis = parse_axis(name)
            if axis in axes:
                raise ConfigError(f"axis {name!r} appears twice in order {order!r}")
            axes.append(axis)
        by_axis = [1] * len(AXES)
        given: dict[Axis, str] = {}
        for key, value in sizes.items():
            axis = parse_axis(key)
            if axis in given:
                raise ConfigError(f"sizes {given[axis]!r} and {key!r} both set axis {axis.value!r}")
            if axis not in axes:
                raise ConfigError(
                    f"size {key!r} names an axis that order {order!r} does not contain; "
                    f"axes in order: {', '.join(order.split('-'))}"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"size {key!r} must be an int >= 1, got {value!r}")
            given[axis] = key
            by_axis[AXES.index(axis)] = value
        full_order = tuple(axes) + tuple(a for a in AXES if a not in axes)
        return cls(sizes=tuple(by_axis), order=full_order)

    @classmethod
    def from_grid(
        cls,
        grid: torch.Tensor | Sequence[object],
        names: Sequence[str],
        axes: Mapping[str, Axis | str] | None = None,
    ) -> MeshLayout:
        """A layout from a rank grid (tensor or nested lists), one name per dimension; as in
        ``DeviceMesh``, the last varies fastest; ``axes`` adds to or overrides ``AXIS_ALIASES``."""
        tensor = torch.as_tensor(grid).detach().to("cpu")
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            raise ConfigError(f"rank grid must hold integers, got dtype {tensor.dtype}")
        if tensor.dim() != len(names):
            raise ConfigError(
                f"rank grid has {tensor.dim()} dimensions but {len(names)} names {tuple(names)}"
            )
        overrides = dict(axes or {})
        dim_axes: list[Axis] = []
        for name in names:
            if name in overrides:
                axis = parse_axis(overrides[name])
            elif str(name).strip().lower() in AXIS_ALIASES:
                axis = parse_axis(name)
            else:
                raise ConfigError(
                    f"mesh dimension {name!r} has no axis; valid names: "
                    f"{', '.join(AXIS_ALIASES)} (or map it with axes={{{name!r}: Axis...}})"
                )
            if axis in dim_axes:
                other = names[dim_axes.index(axis)]
                raise ConfigError(
                    f"mesh dimensions {other!r} and {name!r} both map to {axis.value!r}"
                )
            dim_axes.append(axis)
        by_axis = [1] * len(AXES)
        for axis, size in zip(dim_axes, tensor.shape, strict=True):
            by_axis[AXES.index(axis)] = int(size)
        fastest_first = tuple(reversed(dim_axes))
        full_order = fastest_first + tuple(a for a in AXES if a not in dim_axes)
        ranks = [int(r) for r in tensor.reshape(-1).tolist()]
        return cls(sizes=tuple(by_axis), order=full_order, grid=tuple(ranks))

    @classmethod
    def from_device_mesh(
        cls, mesh: DeviceMesh, axes: Mapping[str, Axis | str] | None = None
    ) -> MeshLayout:
        """A layout from a ``DeviceMesh`` with named dimensions (its rank tensor is used)."""
        names = mesh.mesh_dim_names
        if names is None:
            raise ConfigError(
                "DeviceMesh has no mesh_dim_names; name its dimensions "
                f"(valid names: {', '.join(AXIS_ALIASES)}) or pass axes="
            )
        return cls.from_grid(mesh.mesh, names, axes)

    @property
    def world_size(self) -> int:
        """Number of ranks in the layout."""
        return math.prod(self.sizes)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank of the layout, ascending."""
        if self.grid is None:
            return tuple(range(self.world_size))
        return tuple(sorted(self.grid))

    def size(self, axis: Axis | str) -> int:
        """Degree of ``axis`` (1 when the job does not use it)."""
        return self.sizes[AXES.index(parse_axis(axis))]

    def address(self, rank: int) -> MeshAddress:
        """The mesh address of global ``rank``."""
        if self.grid is None:
            if not 0 <= rank < self.world_size:
                raise ValueError(f"rank {rank} is not in this layout of {self.world_size} ranks")
            pos = rank
        else:
            if rank not in self._positions:
                raise ValueError(f"rank {rank} is not in this layout's rank grid")
            pos = self._positions[rank]
        coords = [
            (pos // stride) % size for stride, size in zip(self._strides, self.sizes, strict=True)
        ]
        return MeshAddress(*coords)

    def rank_of(self, address: MeshAddress) -> int:
        """The global rank at ``address``."""
        pos = 0
        for axis, coord, stride, size in zip(
            AXES, address.as_tuple(), self._strides, self.sizes, strict=True
        ):
            if coord >= size:
                raise ValueError(f"coordinate {axis.value}={coord} is outside size {size}")
            pos += coord * stride
        return pos if self.grid is None else self.grid[pos]

    @property
    def peer_kind(self) -> str:
        """The comparison group SCOUT uses: ``"replica"`` when d > 1, else ``"shard"``."""
        return REPLICA if self.size(Axis.D) > 1 else SHARD

    def axes_for(self, kind: str | Axis | Iterable[str | Axis]) -> tuple[Axis, ...]:
        """The axes a group kind varies, canonical order: ``"replica"`` d, ``"shard"`` s,
        ``"peer"`` whichever :attr:`peer_kind` picks, an axis name (or several) those axes."""
        if isinstance(kind, str):
            name = kind.strip().lower() if not isinstance(kind, Axis) else kind.value
            if name == PEER:
                name = self.peer_kind
            if name == REPLICA:
                return (Axis.D,)
            if name == SHARD:
                return (Axis.S,)
            if name not in AXIS_ALIASES:
                raise ConfigError(
                    f"unknown group kind {kind!r}; valid kinds: {', '.join(GROUP_KINDS)}, "
                    f"or an axis name: {', '.join(AXIS_ALIASES)}"
                )
            return (AXIS_ALIASES[name],)
        varied = {parse_axis(a) for a in kind}
        return tuple(a for a in AXES if a in varied)

    def group_along(self, rank: int, axes: Iterable[Axis | str]) -> tuple[int, ...]:
        """Ranks sharing every coordinate of ``rank`` except those on ``axes``, ascending."""
        varied = {parse_axis(a) for a in axes}
        base = self.address(rank).as_tuple()
        start = sum(
            c * st for a, c, st in zip(AXES, base, self._strides, strict=True) if a not in varied
        )
        return self._members(start, self._offsets(varied))

    def _offsets(self, axes: Iterable[Axis]) -> list[int]:
        """Offsets of every digit combination on ``axes``: a group is a base plus these.

        Integer arithmetic only, no address object per member: fast at 100k ranks."""
        chosen = set(axes)
        digits = [
            range(0, n * st, st)
            for a, n, st in zip(AXES, self.sizes, self._strides, strict=True)
            if a in chosen
        ]
        return [sum(combo) for combo in itertools.product(*digits)]

    def _members(self, start: int, offsets: Sequence[int]) -> tuple[int, ...]:
        positions = [start + o for o in offsets]
        return tuple(sorted(positions if self.grid is None else [self.grid[p] for p in positions]))

    def replica_group(self, rank: int) -> tuple[int, ...]:
        """``G_rep(rank)``: vary d, fix s, t, p, c, e."""
        return self.group_along(rank, (Axis.D,))

    def shard_group(self, rank: int) -> tuple[int, ...]:
        """``G_shard(rank)``: vary s, fix t, p, c, e and d."""
        return self.group_along(rank, (Axis.S,))

    def peer_group(self, rank: int) -> PeerSpec:
        """The group ``rank`` is compared in: ``G_rep`` if d > 1, else ``G_shard``."""
        kind = self.peer_kind
        ranks = self.replica_group(rank) if kind == REPLICA else self.shard_group(rank)
        return PeerSpec(kind=kind, ranks=ranks)

    def groups(self, kind_or_axes: str | Axis | Iterable[str | Axis]) -> list[tuple[int, ...]]:
        """Every group of a kind (see :meth:`axes_for`), sorted: a partition of the ranks in a
        deterministic order, so every rank creates the process groups in one sequence."""
        varied = set(self.axes_for(kind_or_axes))
        offsets = self._offsets(varied)
        return sorted(self._members(base, offsets) for base in self._offsets(set(AXES) - varied))

    def coordinates(self) -> torch.Tensor:
        """Every rank's address at once, ``[world, 6]``: row ``i`` is ``address(ranks[i])``."""
        pos = torch.arange(self.world_size).unsqueeze(1)
        digits = (pos // torch.tensor(self._strides)) % torch.tensor(self.sizes)
        return digits if self.grid is None else digits[torch.argsort(torch.tensor(self.grid))]
