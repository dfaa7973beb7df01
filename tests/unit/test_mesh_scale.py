"""MeshLayout's fast grouping gives exactly the results of the address-by-address definition.

``groups``, ``group_along`` and ``coordinates`` work on mixed-radix positions (integer
arithmetic) so that 100k-rank layouts group in milliseconds; here they are checked
against a reference written straight from the definition (bucket every rank by its
coordinates on the fixed axes) on Megatron-style orders and on shuffled rank grids.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest

from scout_core.topology.mesh import AXES, Axis, MeshAddress, MeshLayout


def reference_groups(layout: MeshLayout, varied: set[Axis]) -> list[tuple[int, ...]]:
    buckets: dict[tuple[int, ...], list[int]] = {}
    for rank in layout.ranks:
        coords = layout.address(rank).as_tuple()
        key = tuple(c for axis, c in zip(AXES, coords, strict=True) if axis not in varied)
        buckets.setdefault(key, []).append(rank)
    return sorted(tuple(sorted(members)) for members in buckets.values())


def reference_group_along(layout: MeshLayout, rank: int, varied: set[Axis]) -> tuple[int, ...]:
    base = layout.address(rank).as_tuple()
    choices = [
        range(size) if axis in varied else (coord,)
        for axis, coord, size in zip(AXES, base, layout.sizes, strict=True)
    ]
    return tuple(sorted(layout.rank_of(MeshAddress(*c)) for c in itertools.product(*choices)))


def layouts() -> list[MeshLayout]:
    rng = random.Random(7)
    out = [
        MeshLayout.from_order("tp-cp-ep-dp-pp", tp=2, cp=2, ep=2, dp=3, pp=2),
        MeshLayout.from_order("pp-dp-tp", tp=4, pp=3, dp=2),
        MeshLayout.from_order("tp-fsdp-dp-pp", tp=2, fsdp=3, dp=2, pp=2),
    ]
    for sizes in ((2, 3, 2, 1, 1, 2), (3, 1, 2, 2, 2, 1)):
        order = list(AXES)
        rng.shuffle(order)
        world = 1
        for s in sizes:
            world *= s
        grid = list(range(5, 5 + world))  # ranks need not start at 0
        rng.shuffle(grid)
        out.append(MeshLayout(sizes=sizes, order=tuple(order), grid=tuple(grid)))
    return out


@pytest.mark.parametrize("layout", layouts(), ids=lambda layout: str(layout.sizes))
def test_fast_grouping_matches_the_definition(layout: MeshLayout) -> None:
    kinds: list[set[Axis]] = [{a} for a in AXES] + [{Axis.D, Axis.S}, {Axis.T, Axis.P}, set()]
    for varied in kinds:
        assert layout.groups(varied) == reference_groups(layout, varied), varied
        for rank in layout.ranks:
            assert layout.group_along(rank, varied) == reference_group_along(layout, rank, varied)
    coords = layout.coordinates().tolist()
    assert coords == [list(layout.address(r).as_tuple()) for r in layout.ranks]


def test_llama3_layout_groups_in_well_under_a_second() -> None:
    layout = MeshLayout.from_order("tp-cp-ep-dp-pp", tp=8, pp=16, dp=128)
    start = time.perf_counter()
    groups = layout.groups("peer")
    coords = layout.coordinates()
    elapsed = time.perf_counter() - start
    assert len(groups) == 128 and {len(g) for g in groups} == {128}
    assert tuple(coords.shape) == (16384, 6)
    assert elapsed < 1.0  # about 10 ms on an idle core; generous for a loaded CI machine
