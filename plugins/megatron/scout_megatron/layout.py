"""The mesh layout of a Megatron job, derived from its parallel sizes and checked against Megatron.

Contract: :func:`megatron_layout` turns the sizes and Megatron's order string into a ``MeshLayout``
(``t`` TP, ``c`` CP, ``e`` EP, ``d`` DP / EP, ``p`` PP, in Megatron's order) whose replica peers
hold the same dense and expert weights, checked against Megatron's ``RankGenerator`` (a layout it
would not build raises ``UnsupportedSetupError``); :func:`peer_sets` gives distributed-optimizer
blocks. Why it fits both generators: docs/megatron.md, "Peers from ``parallel_state``".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scout_core import MeshLayout, UnsupportedSetupError

__all__ = [
    "DEFAULT_ORDER",
    "ParallelSizes",
    "PeerSets",
    "megatron_layout",
    "peer_sets",
    "verify_with_rank_generator",
]

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""``initialize_model_parallel``'s default rank order (first token varies fastest)."""

_TOKEN_AXIS: Mapping[str, str] = {"tp": "t", "cp": "c", "ep": "e", "dp": "d", "pp": "p"}


@dataclass(frozen=True)
class ParallelSizes:
    """The arguments of ``initialize_model_parallel`` that place ranks, and the world size."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int | None = None
    """Virtual pipeline stages (model chunks) per rank; ``None`` without interleaving."""
    dist_opt_instances: int = 1
    """``num_distributed_optimizer_instances``."""
    order: str = DEFAULT_ORDER

    def __post_init__(self) -> None:
        for name in ("world", "tp", "pp", "cp", "ep", "dist_opt_instances"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UnsupportedSetupError(
                    f"Megatron {name} size must be an int >= 1, got {value}"
                )
        tokens = self.order.lower().split("-")
        unknown = sorted(set(tokens) - set(_TOKEN_AXIS))
        if unknown or len(set(tokens)) != len(tokens):
            raise UnsupportedSetupError(
                f"Megatron order {self.order!r} must name each of {', '.join(_TOKEN_AXIS)} at "
                "most once"
            )
        if self.world % (self.tp * self.pp * self.cp):
            raise UnsupportedSetupError(
                f"world size {self.world} is not divisible by tp x pp x cp = "
                f"{self.tp * self.pp * self.cp}"
            )
        if self.world % (self.expert_tp * self.ep * self.pp):
            raise UnsupportedSetupError(
                f"world size {self.world} is not divisible by etp x ep x pp = "
                f"{self.expert_tp * self.ep * self.pp}"
            )

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size: ``etp``, or TP when None (Megatron's default)."""
        return self.tp if self.etp is None else self.etp

    @property
    def dp(self) -> int:
        """Dense data-parallel size: world / (tp x cp x pp)."""
        return self.world // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (etp x ep x pp)."""
        return self.world // (self.expert_tp * self.ep * self.pp)


def megatron_layout(sizes: ParallelSizes, *, verify: bool = True) -> MeshLayout:
    """The ``MeshLayout`` of a Megatron job. ``UnsupportedSetupError`` when one layout cannot
    express both of Megatron's rank generators, or (``verify``) disagrees with them."""
    if sizes.ep > 1 and sizes.expert_tp != sizes.tp:
        raise UnsupportedSetupError(
            f"expert tensor parallel {sizes.expert_tp} != tensor parallel {sizes.tp} with "
            f"expert parallel {sizes.ep} is not supported (expert and dense layers would "
            "need different tensor axes)"
        )
    if sizes.ep > 1 and sizes.cp > 1:
        raise UnsupportedSetupError(
            f"expert parallel {sizes.ep} together with context parallel {sizes.cp} is not "
            "supported (Megatron's expert generator places EP on the ranks of CP)"
        )
    if not sizes.order.lower().endswith("pp") and sizes.pp > 1 and sizes.edp != sizes.dp:
        raise UnsupportedSetupError(
            f"order {sizes.order!r} (pipeline not last) needs equal dense and expert "
            f"data-parallel sizes, got {sizes.dp} and {sizes.edp}; Megatron refuses it too"
        )
    if sizes.dp % sizes.ep:
        raise UnsupportedSetupError(
            f"data parallel {sizes.dp} is not divisible by expert parallel {sizes.ep}"
        )
    degree = {"t": sizes.tp, "c": sizes.cp, "e": sizes.ep, "d": sizes.dp // sizes.ep, "p": sizes.pp}
    tokens = [_TOKEN_AXIS[t] for t in sizes.order.lower().split("-")]
    missing = [a for a, size in degree.items() if a not in tokens and size > 1]
    if missing:
        raise UnsupportedSetupError(
            f"Megatron order {sizes.order!r} leaves out a parallel size > 1 "
            f"({', '.join(missing)}); Megatron refuses that order too"
        )
    layout = MeshLayout.from_order("-".join(tokens), **{a: degree[a] for a in tokens})
    if verify:
        verify_with_rank_generator(sizes, layout)
    return layout


def _generator_groups(sizes: ParallelSizes) -> dict[str, list[list[int]]]:
    """Megatron's own group lists, from its ``RankGenerator`` (no process group needed)."""
    from megatron.core.parallel_state import RankGenerator

    dense = RankGenerator(
        tp=sizes.tp, ep=1, dp=sizes.dp, pp=sizes.pp, cp=sizes.cp, order=sizes.order
    )
    expert = RankGenerator(
        tp=sizes.expert_tp, ep=sizes.ep, dp=sizes.edp, pp=sizes.pp, cp=1, order=sizes.order
    )
    return {
        "tp": dense.get_ranks("tp"),
        "cp": dense.get_ranks("cp"),
        "dp": dense.get_ranks("dp"),
        "dp-cp": dense.get_ranks("dp-cp"),
        "pp": dense.get_ranks("pp"),
        "ep": expert.get_ranks("ep"),
        "expert-dp": expert.get_ranks("dp"),
    }


_GROUP_AXES: Mapping[str, tuple[str, ...]] = {
    "tp": ("t",),
    "cp": ("c",),
    "dp": ("d", "e"),
    "dp-cp": ("d", "e", "c"),
    "pp": ("p",),
    "ep": ("e",),
    "expert-dp": ("d", "c"),
}
"""Which layout axes each of Megatron's groups varies."""


def verify_with_rank_generator(sizes: ParallelSizes, layout: MeshLayout) -> None:
    """Raise :class:`~scout_core.UnsupportedSetupError` unless ``layout`` reproduces Megatron's
    dense and expert groups (TP, CP, DP, DP-CP, PP, EP, expert DP) for every rank."""
    for name, groups in _generator_groups(sizes).items():
        if name in ("ep", "expert-dp") and sizes.expert_tp != sizes.tp:
            continue  # no expert parallelism (checked above): expert groups are unused
        mine = sorted(layout.groups(_GROUP_AXES[name]))
        theirs = sorted(tuple(sorted(g)) for g in groups)
        if mine != theirs:
            raise UnsupportedSetupError(
                f"Megatron order {sizes.order!r} with {sizes}: Megatron's {name} groups "
                f"{theirs[:4]}... differ from the layout's {mine[:4]}...; this layout is "
                "not supported"
            )


@dataclass(frozen=True)
class PeerSets:
    """The rank sets of one rank that hold the same state, by Megatron's groups (sorted)."""

    dense_replicas: tuple[int, ...]
    """Identical dense weights: Megatron's DP-CP group."""
    expert_replicas: tuple[int, ...]
    """Identical expert weights: Megatron's expert-DP group."""
    optimizer_instance: tuple[int, ...]
    """Ranks the distributed optimizer shards state over: this rank's instance in DP-CP."""
    optimizer_instances: tuple[int, ...]
    """Ranks holding the same optimizer shard in the other instances (this rank alone if one)."""


def peer_sets(layout: MeshLayout, sizes: ParallelSizes, rank: int) -> PeerSets:
    """The :class:`PeerSets` of ``rank`` implied by the layout (pure arithmetic)."""
    dense = layout.group_along(rank, ("d", "e", "c"))
    expert = layout.group_along(rank, ("d", "c"))
    # Megatron splits each DP-CP group, listed in generator order (CP before DP
    # under every order that keeps cp before dp), into k contiguous blocks.
    ordered = sorted(dense, key=lambda r: _dp_cp_position(layout, sizes, r))
    block = len(ordered) // sizes.dist_opt_instances
    index = ordered.index(rank)
    instance = tuple(sorted(ordered[(index // block) * block : (index // block + 1) * block]))
    others = tuple(sorted(ordered[index % block :: block]))
    return PeerSets(tuple(dense), tuple(expert), instance, others)


def _dp_cp_position(layout: MeshLayout, sizes: ParallelSizes, rank: int) -> int:
    """Position of ``rank`` in Megatron's DP-CP rank list (its tokens in order)."""
    address = layout.address(rank)
    dp_coord = address.e + sizes.ep * address.d
    position, stride = 0, 1
    for token in sizes.order.lower().split("-"):
        if token == "cp":
            position += address.c * stride
            stride *= sizes.cp
        elif token == "dp":
            position += dp_coord * stride
            stride *= sizes.dp
    return position
