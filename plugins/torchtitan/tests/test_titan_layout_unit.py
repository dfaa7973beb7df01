"""The layout from ``ParallelDims``, dry-run for every rank with the fake backend.

``torch.distributed``'s ``fake`` backend lets one process build TorchTitan's real
meshes as any rank of a large job, so :func:`titan_layout` (which checks every
enabled mesh of the rank against the layout) runs for all ranks of 16-rank layouts
with PP, CP, EP, under all three ``spmd_backend`` mesh vocabularies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from scout_torchtitan.layout import expert_replica_groups, mesh_layout, titan_layout
from torchtitan.distributed.parallel_dims import ParallelDims

from scout_core import Axis, UnsupportedSetupError

BACKENDS = ("partial_dtensor", "spmd_types", "full_dtensor")


def _as_rank(rank: int, world: int, backend: str, **dims: int) -> Iterator[ParallelDims]:
    dist.init_process_group("fake", rank=rank, world_size=world)
    try:
        degrees = {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "ep": 1, **dims}
        pd = ParallelDims(world_size=world, spmd_backend=backend, **degrees)  # type: ignore[arg-type]
        pd.build_mesh()
        yield pd
    finally:
        dist.destroy_process_group()


def _layouts(world: int, backend: str, **dims: int) -> list[Any]:
    out = []
    for rank in range(world):
        for pd in _as_rank(rank, world, backend, **dims):
            out.append(titan_layout(pd))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_layout_and_replicas_for_every_rank(backend: str) -> None:
    dims = {"pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    for tl in _layouts(16, backend, **dims):
        r = tl.rank
        assert tl.layout.sizes == (2, 2, 2, 2, 1, 1)  # d, s, t, p, c, e
        # Row-major over (pp, dp_replicate, dp_shard, cp, tp), tp fastest.
        assert tl.layout.address(r).as_tuple() == ((r >> 2) & 1, (r >> 1) & 1, r & 1, r >> 3, 0, 0)
        assert tl.dense_replicas == tl.layout.group_along(r, (Axis.D, Axis.S, Axis.C))
        assert len(tl.dense_replicas) == 4 and r in tl.dense_replicas
        assert tl.layout.replica_group(r) == tuple(sorted({r, r ^ 4}))
        assert tl.expert_replicas is None
        assert tl.coordinates["pp"] == r >> 3 and tl.coordinates["tp"] == r & 1
        assert tl.spmd_backend == backend


def test_context_parallel_and_experts() -> None:
    dims = {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 4}
    for tl in _layouts(16, "partial_dtensor", **dims):
        r = tl.rank
        address = tl.layout.address(r)
        assert (address.c, address.t) == ((r >> 1) & 1, r & 1)
        # The loss mesh (batch x cp) holds the same full dense weights: same tp only.
        assert tl.dense_replicas == tuple(x for x in range(16) if x & 1 == r & 1)
        # Experts: efsdp = 2*2*2/4 = 2; ep is the fastest axis of (dp_replicate, efsdp, ep).
        assert tl.expert_replicas == tuple(x for x in range(16) if x % 4 == r % 4)
        assert tl.coordinates["ep"] == r % 4 and tl.coordinates["efsdp"] == (r // 4) % 2


def test_expert_groups_without_meshes() -> None:
    class Dims:
        dp_replicate, dp_shard, cp, tp, pp, ep = 2, 2, 1, 2, 1, 2

    groups = expert_replica_groups(Dims())
    assert groups == [(0, 2, 4, 6), (1, 3, 5, 7)]
    Dims.ep = 1
    assert expert_replica_groups(Dims()) == []


def test_world_size_mismatch_is_refused() -> None:
    class Dims:
        dp_replicate, dp_shard, cp, tp, pp, ep, world_size = 2, 1, 1, 2, 1, 1, 8

    with pytest.raises(UnsupportedSetupError, match=r"covers 4 ranks \(.*\) but the job has 8"):
        mesh_layout(Dims())


def test_a_mesh_that_disagrees_with_the_layout_is_refused() -> None:
    for pd in _as_rank(1, 4, "partial_dtensor", dp_replicate=2, tp=2):

        def swapped(dims: Any, real: Any = pd.get_optional_mesh, **kw: Any) -> Any:
            # A TorchTitan that ordered its axes differently would hand out these.
            return real("dp_replicate" if dims == "tp" else dims, **kw)

        pd.get_optional_mesh = swapped  # type: ignore[method-assign]
        with pytest.raises(UnsupportedSetupError, match="mesh 'tp' of rank 1 holds ranks"):
            titan_layout(pd)
