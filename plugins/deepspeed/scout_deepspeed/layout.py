"""The mesh layout of a DeepSpeed job, read off the engine and checked against its groups.

Contract: :func:`engine_layout` turns what DeepSpeed knows into a ``MeshLayout`` (a
``PipelineEngine``'s grid as is; otherwise TP from the ``mpu``, then Ulysses as ``c``, MoE
expert parallel as ``e``, and data parallel slowest, as ``d`` under ZeRO 0-2 and ``s`` under
ZeRO-3), whose replica peers hold the same dense and expert weights. :func:`check_layout`
compares every group DeepSpeed built for this rank with the layout's; ``agree_or_raise``
makes a mismatch an ``UnsupportedSetupError`` on every rank. Docs: docs/deepspeed.md,
"What attaches where" and "Ulysses sequence parallel and MoE expert parallel".
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from scout_core import Axis, MeshLayout, UnsupportedSetupError
from scout_core.plugin_api import group_ranks

__all__ = [
    "TOPOLOGY_AXES",
    "check_layout",
    "engine_layout",
    "expected_groups",
    "expert_parallel_size",
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


def expert_parallel_size(engine: Any) -> int:
    """The ``ep_size`` of the engine's ``MoE`` layers (1 without MoE). Mixed sizes raise
    ``UnsupportedSetupError``: a mesh layout has one expert axis."""
    if not getattr(engine, "has_moe_layers", False):
        return 1
    from deepspeed.moe.layer import MoE

    sizes = {int(m.ep_size) for m in engine.module.modules() if isinstance(m, MoE)}
    if len(sizes) > 1:
        raise UnsupportedSetupError(
            f"MoE layers with different ep_size {sorted(sizes)} are not supported (one expert "
            "axis per job)"
        )
    return sizes.pop() if sizes else 1


def engine_layout(engine: Any, world_size: int) -> MeshLayout:
    """The layout ``engine`` trains with (not yet checked; see :func:`check_layout`)."""
    stage = _zero_stage(engine)
    if is_pipeline(engine):
        return _pipeline_layout(engine, stage)
    tp = int(getattr(engine, "mp_world_size", 1) or 1)
    sp = int(getattr(engine, "sequence_parallel_size", 1) or 1)
    ep = expert_parallel_size(engine)
    if sp > 1 and stage >= 3:
        # ZeRO-3 shards over c x d: two axes, which the core's one shard axis cannot gather on.
        raise UnsupportedSetupError(
            "Ulysses sequence parallelism under ZeRO-3 is not supported (parameters are "
            "partitioned over sequence x data parallel); use ZeRO 1/2"
        )
    if ep > 1 and (sp > 1 or tp > 1 or stage >= 3):
        raise UnsupportedSetupError(
            "MoE expert parallelism is supported with plain data parallelism under ZeRO 0-2 "
            f"only (got sequence parallel {sp}, tensor parallel {tp}, ZeRO stage {stage})"
        )
    # The data-parallel group spans the expert axis (dense weights replicate over d x e);
    # with the Ulysses mpu DeepSpeed reports no data-parallel size at all.
    dp = int(getattr(engine, "dp_world_size", 0) or 0) or world_size // (tp * sp)
    dp //= ep
    data = "s" if stage >= 3 else "d"
    expert_first = not bool(
        getattr(getattr(engine, "_config", None), "use_data_before_expert_parallel_", False)
    )
    order = f"t-c-e-{data}" if expert_first else f"t-c-{data}-e"
    layout = MeshLayout.from_order(order, t=tp, c=sp, e=ep, **{data: max(dp, 1)})
    if layout.world_size != world_size:
        raise UnsupportedSetupError(
            f"DeepSpeed reports tensor parallel {tp} x sequence parallel {sp} x expert parallel "
            f"{ep} x data parallel {dp} = {layout.world_size} ranks, but the job has {world_size}"
        )
    return layout


def _data_axes(layout: MeshLayout) -> tuple[Axis, ...]:
    return (Axis.S,) if layout.size(Axis.S) > 1 else (Axis.D,)


def expected_groups(
    engine: Any, layout: MeshLayout, rank: int
) -> list[tuple[str, Sequence[int], tuple[Axis, ...]]]:
    """(name, DeepSpeed's ranks, layout axes the group varies) the layout must reproduce."""
    triples: list[tuple[str, Sequence[int], tuple[Axis, ...]]] = []

    def add(name: str, group: Any, axes: tuple[Axis, ...]) -> None:
        if group is not None:
            triples.append((name, tuple(sorted(group_ranks(group))), axes))

    if is_pipeline(engine):
        add(
            "pipeline data-parallel group",
            engine.grid.get_data_parallel_group(),
            _data_axes(layout),
        )
        add("pipe-parallel group", engine.grid.get_pipe_parallel_group(), (Axis.P,))
        return triples
    data = _data_axes(layout)
    ep = layout.size(Axis.E)
    mpu = getattr(engine, "mpu", None)
    if layout.size(Axis.T) > 1 and mpu is not None:
        # Megatron's mpu, or DeepSpeed's groups module under AutoTP (tensor_parallel.autotp_size).
        from deepspeed.utils.bwc import bwc_tensor_model_parallel_group

        add("tensor-parallel group", bwc_tensor_model_parallel_group(mpu), (Axis.T,))
    # Dense weights are reduced over d x e under MoE: DeepSpeed's data-parallel group.
    add("data-parallel group", getattr(engine, "data_parallel_group", None), (*data, Axis.E))
    if layout.size(Axis.C) > 1:
        add("sequence-parallel group", getattr(engine, "seq_parallel_group", None), (Axis.C,))
        add(
            "sequence-data-parallel group",
            getattr(engine, "seq_data_parallel_group", None),
            (*data, Axis.C),
        )
    if ep > 1:
        from deepspeed.utils import groups

        name = f"ep_size_{ep}"
        add(f"expert-parallel group {name}", groups._get_expert_parallel_group(name), (Axis.E,))
        add(
            f"expert-data-parallel group {name}",
            groups._get_expert_data_parallel_group(name),
            data,
        )
    return triples


def layout_group(layout: MeshLayout, rank: int, axes: Sequence[Axis]) -> tuple[int, ...]:
    """The layout's ranks of ``rank``'s group along ``axes`` (degree-1 axes are harmless)."""
    return tuple(sorted(layout.group_along(rank, axes)))


def check_layout(engine: Any, layout: MeshLayout, rank: int) -> str | None:
    """None when the layout reproduces DeepSpeed's groups for ``rank``, else the mismatch."""
    for name, ranks, axes in expected_groups(engine, layout, rank):
        mine = layout_group(layout, rank, axes)
        if tuple(ranks) != mine:
            return (
                f"DeepSpeed's {name} of rank {rank} is {list(ranks)}, but the layout SCOUT "
                f"derived ({layout}) gives {list(mine)}"
            )
    return None
