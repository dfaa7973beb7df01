"""Rank bodies for the live-group layout tests (run through ``run_ranks``)."""

from __future__ import annotations

from typing import Any


def layouts_match_live_groups(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each config: initialise Megatron's groups, derive the layout, compare, tear down."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from scout_megatron.layout import megatron_layout
    from scout_megatron.live_groups import (
        check_live_groups,
        sizes_from_parallel_state,
        training_groups,
    )

    from scout_core.plugin_api import group_ranks

    rank = dist.get_rank()
    out = []
    for config in configs:
        kwargs = dict(config)
        order = kwargs.pop("order", "tp-cp-ep-dp-pp")
        ps.initialize_model_parallel(order=order, **kwargs)
        sizes = sizes_from_parallel_state(order)
        layout = megatron_layout(sizes)
        groups = training_groups()
        out.append(
            {
                "problem": check_live_groups(layout, sizes, rank),
                "address": list(layout.address(rank).as_tuple()),
                "vpp": sizes.vpp,
                "instances": sizes.dist_opt_instances,
                "groups": {name: list(group_ranks(g)) for name, g in sorted(groups.items())},
            }
        )
        ps.destroy_model_parallel()
    return out
