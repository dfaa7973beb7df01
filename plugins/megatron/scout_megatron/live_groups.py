"""What ``initialize_model_parallel`` built on this rank, read from Megatron.

Contract: :func:`sizes_from_parallel_state` reads the live parallel sizes, :func:`training_groups`
Megatron's process groups by role, and :func:`check_live_groups` compares the live groups with
the layout :mod:`.layout` derives, returning the first mismatch.
"""

from __future__ import annotations

from typing import Any

from scout_core import MeshLayout
from scout_core.plugin_api import group_ranks
from scout_megatron.layout import DEFAULT_ORDER, ParallelSizes, peer_sets

__all__ = ["check_live_groups", "sizes_from_parallel_state", "training_groups"]


def sizes_from_parallel_state(order: str = DEFAULT_ORDER) -> ParallelSizes:
    """The :class:`ParallelSizes` of the live ``parallel_state`` (after initialisation)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    vpp = ps.get_virtual_pipeline_model_parallel_world_size()
    intra = ps.get_data_parallel_world_size(with_context_parallel=True, partial_data_parallel=True)
    full = ps.get_data_parallel_world_size(with_context_parallel=True)
    return ParallelSizes(
        world=dist.get_world_size(),
        tp=ps.get_tensor_model_parallel_world_size(),
        pp=ps.get_pipeline_model_parallel_world_size(),
        cp=ps.get_context_parallel_world_size(),
        ep=ps.get_expert_model_parallel_world_size(),
        etp=ps.get_expert_tensor_parallel_world_size(),
        vpp=int(vpp) if vpp else None,
        dist_opt_instances=full // intra,
        order=order,
    )


def training_groups() -> dict[str, Any]:
    """Megatron's training groups of this rank (those built) by ``ProcessGroupCollection`` name.
    Only for reference and re-pointing: SCOUT never sends diagnostic traffic on them."""
    import dataclasses

    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection

    collection = ProcessGroupCollection.use_mpu_process_groups()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(collection):
        group = getattr(collection, f.name, None)
        if isinstance(group, dist.ProcessGroup):
            out[f.name] = group
    return out


def check_live_groups(layout: MeshLayout, sizes: ParallelSizes, rank: int) -> str | None:
    """None when the groups Megatron built for ``rank`` match the layout, else the mismatch."""
    from megatron.core import parallel_state as ps

    peers = peer_sets(layout, sizes, rank)
    live = {
        "tensor-parallel": (ps.get_tensor_model_parallel_group(), ("t",)),
        "pipeline-parallel": (ps.get_pipeline_model_parallel_group(), ("p",)),
        "context-parallel": (ps.get_context_parallel_group(), ("c",)),
        "data-parallel": (ps.get_data_parallel_group(), ("d", "e")),
        "data-parallel with context": (
            ps.get_data_parallel_group(with_context_parallel=True),
            ("d", "e", "c"),
        ),
    }
    if sizes.expert_tp == sizes.tp:
        live["expert-parallel"] = (ps.get_expert_model_parallel_group(), ("e",))
        live["expert-data-parallel"] = (ps.get_expert_data_parallel_group(), ("d", "c"))
    for name, (group, axes) in live.items():
        theirs = tuple(sorted(group_ranks(group)))
        mine = layout.group_along(rank, axes)
        if theirs != mine:
            return (
                f"Megatron's {name} group of rank {rank} is {list(theirs)}, but the layout "
                f"derived from {sizes} gives {list(mine)}"
            )
    partial = ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
    if tuple(sorted(group_ranks(partial))) != peers.optimizer_instance:
        return (
            f"Megatron's partial data-parallel group of rank {rank} is "
            f"{sorted(group_ranks(partial))}, the layout gives {list(peers.optimizer_instance)}"
        )
    return None
