"""Rank bodies for the replay-safety test: a TP=2 layer replayed on SCOUT's own groups."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _seqs(groups: dict[str, Any]) -> dict[str, int]:
    """Collectives issued so far on each group (Gloo counts every collective it runs)."""
    return {name: int(g._get_sequence_number_for_group()) for name, g in groups.items()}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def _call(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor):
    """Forward on copied parameters; returns (output, closure that runs the backward)."""
    params = {n: p.detach().clone().requires_grad_(True) for n, p in layer.named_parameters()}
    inp = x.detach().clone().requires_grad_(True)
    out, _ = torch.func.functional_call(layer, params, (inp,), {"attention_mask": mask})

    def backward() -> list[torch.Tensor]:
        loss = (out.float() * weight).sum()
        return list(torch.autograd.grad(loss, [inp, *params.values()]))

    return out.detach(), backward


def _scout_groups(all_ranks: list[tuple[int, ...]], rank: int) -> Any:
    """SCOUT's substitutes: a new Gloo group per TP group of the layout, created by every
    rank in the same order; this rank's one."""
    mine = None
    for ranks in all_ranks:
        group = dist.new_group(list(ranks), backend="gloo")
        if rank in ranks:
            mine = group
    return mine


def replay_tp_layer() -> dict[str, Any]:
    from megatron.core import parallel_state as ps
    from scout_megatron import testing as mgt
    from scout_megatron.layout import megatron_layout
    from scout_megatron.live_groups import sizes_from_parallel_state, training_groups
    from scout_megatron.modules import chunk_modules
    from scout_megatron.regroup import ForbiddenGroupError, Regrouper

    mgt.initialize(tensor_model_parallel_size=2)
    spec = mgt.TinyGPT()
    model = mgt.build_model(spec)
    layer = chunk_modules([model])[0].layers[0][1]
    rank = dist.get_rank()

    layout = megatron_layout(sizes_from_parallel_state())
    scout_tp = _scout_groups(layout.groups("t"), rank)
    regrouper = Regrouper([scout_tp])

    watched = dict(training_groups())
    watched["dp_gloo"] = ps.get_data_parallel_group_gloo()
    watched["world"] = dist.group.WORLD
    watched["scout_tp"] = scout_tp

    # The same input on both TP partners (TP layers need it), different per DP rank.
    gen = torch.Generator().manual_seed(100 + ps.get_data_parallel_rank())
    x = torch.randn(spec.seq_length, spec.micro_batch_size, spec.hidden_size, generator=gen)
    weight = torch.randn(x.shape, generator=gen)
    mask = mgt.get_batch(spec, 0).attention_mask

    before = _seqs(watched)
    normal_out, normal_backward = _call(layer, x, mask, weight)
    normal_grads = normal_backward()
    normal_traffic = _delta(before, _seqs(watched))

    held = layer.self_attention.linear_proj.tp_group
    collection = layer.pg_collection
    sites = regrouper.sites(layer)
    before = _seqs(watched)
    with regrouper.repointed(layer):
        inside = layer.self_attention.linear_proj.tp_group is scout_tp
        shared = layer.pg_collection is layer.self_attention.pg_collection
        replay_out, replay_backward = _call(layer, x, mask, weight)
    replay_grads = replay_backward()  # after the block: autograd kept SCOUT's group
    replay_traffic = _delta(before, _seqs(watched))
    restored = layer.self_attention.linear_proj.tp_group is held and layer.pg_collection is (
        collection
    )

    # Without a substitute the TP group is forbidden: the replay fails loudly, and
    # nothing reaches the training group.
    before = _seqs(watched)
    forbidden = ""
    try:
        with Regrouper([]).repointed(layer):
            _call(layer, x, mask, weight)
    except (ForbiddenGroupError, ValueError) as exc:  # torch refuses the unknown group
        forbidden = str(exc)
    forbidden_traffic = _delta(before, _seqs(watched))
    restored_after_error = layer.self_attention.linear_proj.tp_group is held

    out = {
        "normal_traffic": normal_traffic,
        "replay_traffic": replay_traffic,
        "forbidden_traffic": forbidden_traffic,
        "forbidden": forbidden,
        "outputs_equal": torch.equal(normal_out, replay_out),
        "grads_equal": all(
            torch.equal(a, b) for a, b in zip(normal_grads, replay_grads, strict=True)
        ),
        "n_grads": len(replay_grads),
        "inside": inside,
        "shared_copy": shared,
        "restored": restored,
        "restored_after_error": restored_after_error,
        "sites": sorted({(s.attr, s.substituted) for s in sites}),
        "tp_ranks": list(layout.group_along(rank, ("t",))),
    }
    mgt.teardown()
    return out
