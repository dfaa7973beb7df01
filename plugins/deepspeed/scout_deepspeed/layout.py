"""The mesh layout of a DeepSpeed job, read off the engine and checked against its groups.

SCOUT compares a rank with its *peers*: the ranks that hold the same state and run
the same work. DeepSpeed knows who they are; this module turns what it knows into a
:class:`~scout_core.mesh.MeshLayout`, from which the core builds its own Gloo
diagnostic groups (DeepSpeed's groups are never used for diagnostic traffic):

* **PipelineEngine**: the pipeline grid's topology (``engine.grid._topo``, axes
  ``pipe`` / ``data`` / ``model``) becomes the rank grid as is, so peer groups are
  per stage and per tensor slice.
* **DeepSpeedEngine**: tensor parallel from the ``mpu`` (Megatron convention: TP
  ranks contiguous), Ulysses sequence parallel next (DeepSpeed's sequence groups
  are contiguous too), data parallel slowest. Under ZeRO-1/2 parameters are
  replicated over the data-parallel group, so data parallel is the replica axis
  ``d``; under ZeRO-3 each rank owns one shard of every parameter, so it is the
  state-shard axis ``s`` (there are no replicas to compare shards with).

The derivation relies on DeepSpeed's conventions, so it is *checked*: this rank's
data-parallel group as DeepSpeed built it must equal the layout's replica (or
shard) group, and the pipeline stage group likewise. Every rank runs the check and
the outcome is agreed on a throw-away Gloo group, so a mismatch raises
:class:`~scout_core.errors.UnsupportedSetupError` on every rank instead of leaving
some ranks inside a collective the others never join.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from scout_core.errors import UnsupportedSetupError
from scout_core.mesh import Axis, MeshLayout

__all__ = [
    "TOPOLOGY_AXES",
    "agree_or_raise",
    "check_layout",
    "engine_layout",
    "expected_groups",
    "group_ranks",
    "is_pipeline",
    "layout_group",
]

TOPOLOGY_AXES: Mapping[str, Axis] = {"pipe": Axis.P, "data": Axis.D, "model": Axis.T}
"""DeepSpeed ``ProcessTopology`` axis names and the SCOUT axes they are."""


def is_pipeline(engine: Any) -> bool:
    """Whether ``engine`` is a ``PipelineEngine`` (checked by class, never by importing)."""
    return any(cls.__name__ == "PipelineEngine" for cls in type(engine).__mro__) and (
        getattr(engine, "grid", None) is not None
    )


def group_ranks(group: Any) -> tuple[int, ...] | None:
    """Global ranks of a process group, sorted; None for no group."""
    if group is None:
        return None
    return tuple(sorted(int(r) for r in dist.get_process_group_ranks(group)))


def _zero_stage(engine: Any) -> int:
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
    return int(stage or 0)


def _pipeline_layout(engine: Any, stage: int) -> MeshLayout:
    topo = engine.grid._topo
    names = [str(a) for a in topo.axes]
    dims = [int(d) for d in topo.dims]
    unknown = [n for n in names if n not in TOPOLOGY_AXES]
    if unknown:
        raise UnsupportedSetupError(
            f"pipeline topology axes {unknown} are not known to scout-deepspeed "
            f"(known: {', '.join(TOPOLOGY_AXES)})"
        )
    grid = torch.zeros(dims, dtype=torch.int64)
    for coord in itertools.product(*(range(d) for d in dims)):
        grid[coord] = int(topo.get_rank(**dict(zip(names, coord, strict=True))))
    axes: dict[str, Axis] = {n: TOPOLOGY_AXES[n] for n in names}
    if stage >= 3:
        axes["data"] = Axis.S
    return MeshLayout.from_grid(grid, names, axes)


def engine_layout(engine: Any, world_size: int) -> MeshLayout:
    """The layout ``engine`` trains with (not yet checked; see :func:`check_layout`)."""
    stage = _zero_stage(engine)
    if is_pipeline(engine):
        return _pipeline_layout(engine, stage)
    tp = int(getattr(engine, "mp_world_size", 1) or 1)
    sp = int(getattr(engine, "sequence_parallel_size", 1) or 1)
    dp = int(getattr(engine, "dp_world_size", 0) or 0) or world_size // (tp * sp)
    data = "s" if stage >= 3 else "d"
    layout = MeshLayout.from_order(f"t-c-{data}", t=tp, c=sp, **{data: dp})
    if layout.world_size != world_size:
        raise UnsupportedSetupError(
            f"DeepSpeed reports tensor parallel {tp} x sequence parallel {sp} x data parallel "
            f"{dp} = {layout.world_size} ranks, but the job has {world_size}"
        )
    return layout


def expected_groups(engine: Any, layout: MeshLayout, rank: int) -> list[tuple[str, Sequence[int]]]:
    """(name, DeepSpeed's ranks) pairs the layout must reproduce for ``rank``."""
    pairs: list[tuple[str, Sequence[int]]] = []
    if is_pipeline(engine):
        dp = group_ranks(engine.grid.get_data_parallel_group())
        if dp is not None:
            pairs.append(("pipeline data-parallel group", dp))
        pipe = group_ranks(engine.grid.get_pipe_parallel_group())
        if pipe is not None:
            pairs.append(("pipe-parallel group", pipe))
        return pairs
    dp = group_ranks(getattr(engine, "data_parallel_group", None))
    if dp is not None:
        pairs.append(("data-parallel group", dp))
    if layout.size(Axis.C) > 1:
        sp = group_ranks(getattr(engine, "seq_parallel_group", None))
        if sp is not None:
            pairs.append(("sequence-parallel group", sp))
    return pairs


def layout_group(layout: MeshLayout, rank: int, name: str) -> tuple[int, ...]:
    """The layout's ranks for one of :func:`expected_groups`' names."""
    if name == "pipe-parallel group":
        axes: tuple[Axis, ...] = (Axis.P,)
    elif name == "sequence-parallel group":
        axes = (Axis.C,)
    else:
        axes = (Axis.S,) if layout.size(Axis.S) > 1 else (Axis.D,)
    return tuple(sorted(layout.group_along(rank, axes)))


def check_layout(engine: Any, layout: MeshLayout, rank: int) -> str | None:
    """None when the layout reproduces DeepSpeed's groups for ``rank``, else the mismatch."""
    for name, ranks in expected_groups(engine, layout, rank):
        mine = layout_group(layout, rank, name)
        if tuple(ranks) != mine:
            return (
                f"DeepSpeed's {name} of rank {rank} is {list(ranks)}, but the layout SCOUT "
                f"derived ({layout}) gives {list(mine)}"
            )
    return None


def agree_or_raise(problem: str | None, world_size: int) -> None:
    """All ranks learn whether any rank found a problem; every rank raises if one did."""
    if world_size <= 1:
        if problem is not None:
            raise UnsupportedSetupError(f"scout-deepspeed: {problem}")
        return
    group = dist.new_group(list(range(world_size)), backend="gloo")
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if problem is not None:
        raise UnsupportedSetupError(f"scout-deepspeed: {problem}")
    if int(flag.item()):
        raise UnsupportedSetupError(
            "scout-deepspeed: another rank found that the parallel layout does not match "
            "DeepSpeed's process groups (see that rank's error)"
        )
