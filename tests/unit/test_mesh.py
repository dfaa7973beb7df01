"""Mesh layouts and peer groups against the paper's examples, Megatron's rank order and
the published layouts of paper Table 2, all without a process group."""

from __future__ import annotations

import pytest
import torch

from scout_core.errors import ConfigError
from scout_core.topology.mesh import (
    AXES,
    AXIS_ALIASES,
    Axis,
    MeshAddress,
    MeshLayout,
    PeerSpec,
    attribution_scope,
    parse_axis,
)
from scout_core.vocabulary import Scope


def _assert_partition(groups: list[tuple[int, ...]], world: int) -> None:
    members = [r for g in groups for r in g]
    assert sorted(members) == list(range(world))  # every rank exactly once


# ---------------------------------------------------------------- vocabulary


@pytest.mark.parametrize(
    ("name", "axis"),
    [
        ("d", Axis.D),
        ("dp", Axis.D),
        ("dp_replicate", Axis.D),
        ("s", Axis.S),
        ("fsdp", Axis.S),
        ("dp_shard", Axis.S),
        ("shard", Axis.S),
        ("tp", Axis.T),
        ("TP", Axis.T),
        ("pp", Axis.P),
        ("cp", Axis.C),
        ("ep", Axis.E),
        (Axis.E, Axis.E),
    ],
)
def test_parse_axis_accepts_framework_spellings(name: str, axis: Axis) -> None:
    assert parse_axis(name) is axis


def test_parse_axis_rejects_unknown_name_listing_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'vp'.*dp_replicate.*dp_shard"):
        parse_axis("vp")


def test_axes_are_the_address_fields() -> None:
    assert [a.value for a in AXES] == ["d", "s", "t", "p", "c", "e"]
    assert set(AXIS_ALIASES.values()) == set(AXES)
    address = MeshAddress(d=3, t=1, e=2)
    assert address.get(Axis.D) == 3
    assert address.get("tp") == 1
    assert address.get("ep") == 2
    assert address.get("s") == 0
    assert address.as_tuple() == (3, 0, 1, 0, 0, 2)
    with pytest.raises(ValueError, match="coordinate t"):
        MeshAddress(t=-1)


@pytest.mark.parametrize(
    ("size", "scope"), [(1, None), (2, Scope.GROUP), (3, Scope.RANK), (192, Scope.RANK)]
)
def test_attribution_scope(size: int, scope: Scope | None) -> None:
    assert attribution_scope(size) == scope


def test_attribution_scope_rejects_empty_group() -> None:
    with pytest.raises(ValueError, match="group_size"):
        attribution_scope(0)


# ---------------------------------------------------------------- paper examples


def test_example_a_dp4_tp2_row_major() -> None:
    # PAPER.md Example A: shape (4,1,2,1,1,1), rank = 2d + t.
    layout = MeshLayout.from_order("tp-dp", tp=2, dp=4)
    assert layout.world_size == 8
    for rank in range(8):
        address = layout.address(rank)
        assert rank == 2 * address.d + address.t
        assert layout.rank_of(address) == rank
    assert layout.replica_group(0) == (0, 2, 4, 6)
    assert layout.replica_group(1) == (1, 3, 5, 7)
    assert layout.replica_group(6) == (0, 2, 4, 6)
    assert layout.peer_group(3) == PeerSpec(kind="replica", ranks=(1, 3, 5, 7))
    assert layout.peer_group(3).scope is Scope.RANK
    assert layout.groups("replica") == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert layout.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_figure_2_dp_fsdp_mesh() -> None:
    # 4x2 DP-FSDP mesh: rows are shard groups S0..S3, columns the C3 groups.
    layout = MeshLayout.from_order("fsdp-dp", fsdp=2, dp=4)
    assert layout.groups("shard") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.groups("replica") == [(0, 2, 4, 6), (1, 3, 5, 7)]
    # HSDP (d > 1): the comparison group is the replica group, not the shard group.
    assert layout.peer_group(4) == PeerSpec(kind="replica", ranks=(0, 2, 4, 6))
    assert layout.shard_group(4) == (4, 5)
    assert layout.groups("peer") == layout.groups("replica")
    assert layout.group_along(5, [Axis.D, Axis.S]) == tuple(range(8))


def test_figure_3_adds_two_tp_slices() -> None:
    # Figure 3: TP degree 2 over the Figure 2 mesh; slice 0 is r0..r7, slice 1 r8..r15.
    layout = MeshLayout.from_order("fsdp-dp-tp", fsdp=2, dp=4, tp=2)
    assert layout.world_size == 16
    assert layout.group_along(4, ["tp"]) == (4, 12)
    assert layout.shard_group(4) == (4, 5)
    assert layout.replica_group(4) == (0, 2, 4, 6)  # the DP-aligned C3 column in slice 0
    assert layout.replica_group(12) == (8, 10, 12, 14)
    assert layout.groups("t") == [(k, k + 8) for k in range(8)]
    for kind in ("t", "shard", "replica"):
        _assert_partition(layout.groups(kind), 16)


def test_pure_fsdp_compares_shards() -> None:
    layout = MeshLayout.from_order("fsdp", fsdp=4)
    assert layout.peer_kind == "shard"
    assert layout.peer_group(2) == PeerSpec(kind="shard", ranks=(0, 1, 2, 3))
    assert layout.replica_group(2) == (2,)


def test_single_rank_has_nothing_to_compare() -> None:
    layout = MeshLayout.from_order("tp", tp=1)
    spec = layout.peer_group(0)
    assert spec == PeerSpec(kind="shard", ranks=(0,))
    assert spec.scope is None


def test_context_axis_is_fixed_in_replica_groups() -> None:
    layout = MeshLayout.from_order("tp-cp-dp", tp=2, cp=2, dp=3)
    group = layout.replica_group(1)
    assert group == (1, 5, 9)
    assert {layout.address(r).c for r in group} == {0}
    assert {layout.address(r).t for r in group} == {1}


def test_megatron_docstring_example_tp2_pp4_dp2() -> None:
    # megatron.core.parallel_state.initialize_model_parallel docstring: 16 GPUs,
    # tp=2, pp=4, dp=2, default order tp-cp-ep-dp-pp.
    layout = MeshLayout.from_order("tp-cp-ep-dp-pp", tp=2, pp=4, dp=2)
    assert layout.groups("tp") == [(2 * k, 2 * k + 1) for k in range(8)]
    assert layout.groups("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert layout.groups("dp") == [
        (0, 2),
        (1, 3),
        (4, 6),
        (5, 7),
        (8, 10),
        (9, 11),
        (12, 14),
        (13, 15),
    ]


# Paper Table 2: (layout as Megatron order and sizes, GPUs, peer degree). Skywork-MoE's
# EDP4 partitions work like an expert axis, so it is modelled on e.
TABLE_2 = {
    "Megatron 1T": ({"tp": 8, "pp": 64, "dp": 6}, 3072, 6),
    "MegaScale 175B": ({"tp": 8, "pp": 8, "dp": 192}, 12288, 192),
    "GLM-130B": ({"tp": 4, "pp": 8, "dp": 24}, 768, 24),
    "Llama 3 405B": ({"tp": 8, "pp": 16, "dp": 128}, 16384, 128),
    "Skywork-MoE": ({"pp": 12, "ep": 4, "dp": 32}, 1536, 32),
    "MegaScale-MoE": ({"pp": 15, "ep": 8, "dp": 12}, 1440, 12),
}


@pytest.mark.parametrize("model", list(TABLE_2))
def test_table_2_published_layouts(model: str) -> None:
    sizes, gpus, degree = TABLE_2[model]
    layout = MeshLayout.from_order("tp-cp-ep-dp-pp", **sizes)
    assert layout.world_size == gpus
    groups = layout.groups("peer")
    assert len(groups) == gpus // degree
    assert {len(g) for g in groups} == {degree}
    _assert_partition(groups, gpus)
    last = gpus - 1
    spec = layout.peer_group(last)
    assert spec.kind == "replica"
    assert spec.size == degree
    assert last in spec.ranks
    # Members differ only in d: same t, p, c, e (and s) as the rank itself.
    fixed = {layout.address(r).as_tuple()[1:] for r in spec.ranks}
    assert fixed == {layout.address(last).as_tuple()[1:]}
    assert sorted(layout.address(r).d for r in spec.ranks) == list(range(degree))


# ---------------------------------------------------------------- from_order validation


@pytest.mark.parametrize(
    ("order", "sizes", "message"),
    [
        ("tp-vp-dp", {}, r"'vp'.*valid names"),
        ("tp-dp-tp", {"tp": 2}, r"'tp' appears twice"),
        ("tp-dp-d", {}, r"'d' appears twice"),
        ("tp-dp", {"tp": 0}, r"'tp' must be an int >= 1"),
        ("tp-dp", {"pp": 2}, r"'pp' names an axis.*axes in order: tp, dp"),
        ("tp-dp", {"zz": 2}, r"'zz'.*valid names"),
        ("tp-dp", {"tp": 2, "t": 2}, r"'tp' and 't' both set axis 't'"),
    ],
)
def test_from_order_rejects_bad_input(order: str, sizes: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MeshLayout.from_order(order, **sizes)


def test_address_rejects_ranks_outside_layout() -> None:
    layout = MeshLayout.from_order("tp-dp", tp=2, dp=2)
    with pytest.raises(ValueError, match="rank 4"):
        layout.address(4)
    with pytest.raises(ValueError, match="t=2"):
        layout.rank_of(MeshAddress(t=2))
    with pytest.raises(ConfigError, match=r"unknown group kind 'rows'.*replica, shard, peer"):
        layout.groups("rows")


# ---------------------------------------------------------------- grids and DeviceMesh


def test_identity_grid_equals_order_string() -> None:
    grid = torch.arange(8).reshape(4, 2)  # dims (dp, tp): tp varies fastest
    assert MeshLayout.from_grid(grid, ("dp", "tp")) == MeshLayout.from_order("tp-dp", tp=2, dp=4)
    nested = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert MeshLayout.from_grid(nested, ("dp", "tp")).grid is None


def test_non_trivial_rank_grid() -> None:
    # dim 0 is dp_replicate, dim 1 dp_shard; ranks placed column-major.
    layout = MeshLayout.from_grid([[0, 2], [1, 3]], ("dp_replicate", "dp_shard"))
    assert layout.grid == (0, 2, 1, 3)
    assert layout.replica_group(0) == (0, 1)
    assert layout.shard_group(0) == (0, 2)
    assert layout.address(2) == MeshAddress(d=0, s=1)
    assert layout.rank_of(MeshAddress(d=1, s=1)) == 3
    assert layout.groups("replica") == [(0, 1), (2, 3)]
    assert layout.groups("shard") == [(0, 2), (1, 3)]


def test_grid_ranks_need_not_start_at_zero() -> None:
    layout = MeshLayout.from_grid([[4, 5], [6, 7]], ("dp", "tp"))
    assert layout.ranks == (4, 5, 6, 7)
    assert layout.replica_group(5) == (5, 7)
    with pytest.raises(ValueError, match="rank 0"):
        layout.address(0)


def test_grid_dimension_names_are_mapped_or_rejected() -> None:
    grid = torch.arange(4).reshape(2, 2)
    with pytest.raises(ConfigError, match=r"'rows' has no axis; valid names: d, dp"):
        MeshLayout.from_grid(grid, ("rows", "tp"))
    layout = MeshLayout.from_grid(grid, ("rows", "tp"), axes={"rows": Axis.D})
    assert layout.replica_group(1) == (1, 3)
    with pytest.raises(ConfigError, match=r"'dp' and 'dp_replicate' both map to 'd'"):
        MeshLayout.from_grid(grid, ("dp", "dp_replicate"))
    with pytest.raises(ConfigError, match="2 dimensions but 1 names"):
        MeshLayout.from_grid(grid, ("dp",))
    with pytest.raises(ConfigError, match="appears twice"):
        MeshLayout.from_grid([[0, 1], [1, 2]], ("dp", "tp"))


def test_from_device_mesh_needs_names() -> None:
    class Unnamed:
        mesh = torch.arange(4).reshape(2, 2)
        mesh_dim_names = None

    with pytest.raises(ConfigError, match="mesh_dim_names"):
        MeshLayout.from_device_mesh(Unnamed())  # type: ignore[arg-type]  # duck-typed stand-in

    class Named:
        mesh = torch.tensor([[0, 2], [1, 3]])
        mesh_dim_names = ("dp_replicate", "dp_shard")

    layout = MeshLayout.from_device_mesh(Named())  # type: ignore[arg-type]  # duck-typed stand-in
    assert layout.groups("replica") == [(0, 1), (2, 3)]


def test_equal_layouts_compare_equal_however_built() -> None:
    a = MeshLayout.from_order("tp-cp-ep-dp-pp", tp=2, dp=4)
    b = MeshLayout.from_order("tp-dp", tp=2, dp=4)
    c = MeshLayout.from_order("pp-tp-dp", tp=2, dp=4)
    assert a == b == c
    assert hash(a) == hash(c)
    assert a.order[:2] == (Axis.T, Axis.D)
