"""Rank-side inspections of a live TorchTitan ``Trainer`` (``run_trainer(..., inspect=...)``).

Each function takes the trainer a rank built from the real TorchTitan entry flow
and returns JSON: what the plugin's fact functions report about it, or what a
scenario (hooks, checkpoints, TP replay) observed.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist


def _sha(t: torch.Tensor) -> str:
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def facts(trainer: Any) -> dict[str, Any]:
    """Layout, modules, optimizers and RNG as the plugin reads them off the trainer."""
    from scout_torchtitan.layout import titan_layout
    from scout_torchtitan.modules import find_titan_modules
    from scout_torchtitan.optimizers import titan_optimizers
    from scout_torchtitan.rng import titan_rng_streams

    tl = titan_layout(trainer.parallel_dims)
    mods = find_titan_modules(trainer.model_parts)
    opts = titan_optimizers(trainer.optimizers, trainer.model_parts)
    return {
        "rank": tl.rank,
        "sizes": list(tl.layout.sizes),
        "address": list(tl.layout.address(tl.rank).as_tuple()),
        "replica_group": list(tl.layout.replica_group(tl.rank)),
        "dense_replicas": list(tl.dense_replicas),
        "coordinates": tl.coordinates,
        "layers": [layer.path for layer in mods.layers],
        "outer": sorted({type(layer.outer).__name__ for layer in mods.layers}),
        "block": sorted({type(layer.block).__name__ for layer in mods.layers}),
        "embedding": None if mods.embedding is None else mods.embedding.path,
        "lm_head": None if mods.lm_head is None else mods.lm_head.path,
        "container": type(opts.container).__name__,
        "container_is_optimizer": isinstance(opts.container, torch.optim.Optimizer),
        "per_part": [[p.part, type(p.optimizer).__name__] for p in opts.per_part],
        "rng": [s.name for s in titan_rng_streams()],
        "cpu_rng": _sha(torch.get_rng_state()),
        "checkpointer": type(trainer.checkpointer).__name__,
        "seen": asdict(trainer.checkpointer.scout_seen)
        if hasattr(trainer.checkpointer, "scout_seen")
        else None,
    }


def optimizer_hooks(trainer: Any) -> dict[str, Any]:
    """Count step hooks on the container and the inner optimizers, then train."""
    from scout_torchtitan.optimizers import titan_optimizers

    opts = titan_optimizers(trainer.optimizers, trainer.model_parts)
    counts = {"container": 0, "inner": 0}

    def bump(key: str) -> Any:
        def hook(*_: Any) -> None:
            counts[key] += 1

        return hook

    opts.container.register_step_post_hook(bump("container"))
    for part in opts.per_part:
        part.optimizer.register_step_post_hook(bump("inner"))
    trainer.optimizers.state_dict()  # what a checkpoint save does on a fresh optimizer
    after_state_dict = dict(counts)
    trainer.train()
    return {"after_state_dict": after_state_dict, "after_train": counts, "step": trainer.step}


def rng_roundtrip(trainer: Any) -> dict[str, Any]:
    """Each stream's state restores the draws it was taken before."""
    from scout_torchtitan.rng import titan_rng_streams

    out = {}
    for stream in titan_rng_streams():
        state = stream.get()
        first = torch.rand(4)
        stream.set(state)
        out[stream.name] = bool(torch.equal(first, torch.rand(4))) and state.dtype == torch.uint8
    return out


# -- checkpoints -----------------------------------------------------------------------


def checkpoint_save_then_train_on(trainer: Any) -> dict[str, Any]:
    """Train half the configured steps, save through the IO, train on, save again.

    Run with ``--checkpoint.load_only``: TorchTitan then saves nothing itself, so every
    checkpoint on disk was written by the IO.
    """
    from scout_torchtitan.checkpoint_io import TitanCheckpointIO
    from scout_torchtitan.testing import state_digest

    io = TitanCheckpointIO(trainer.checkpointer)
    total = trainer.config.training.steps
    trainer.config.training.steps = total // 2
    trainer.train()
    tag = io.tag_for(trainer.step - 1)
    saved = io.save(tag)
    at_save = state_digest(trainer)
    step_at_save = trainer.step
    trainer.config.training.steps = total
    trainer.train()  # TorchTitan's train() first reloads the newest checkpoint: ours
    io.save(io.tag_for(trainer.step - 1))
    return {
        "tag": tag,
        "saved": saved,
        "tags": list(io.list_tags()),
        "directory": io.directory,
        "writes_metadata": io.writes_metadata(),
        "step_at_save": step_at_save,
        "at_save": at_save,
        "step_after": trainer.step,
        "after": state_digest(trainer),
    }


def checkpoint_load_fresh(trainer: Any) -> dict[str, Any]:
    """In fresh processes: list, load the saved tag, report; then the error paths."""
    from scout_torchtitan.checkpoint_io import TitanCheckpointIO
    from scout_torchtitan.testing import state_digest

    from scout_core import CheckpointError

    io = TitanCheckpointIO(trainer.checkpointer)
    tags = list(io.list_tags())
    before = state_digest(trainer)
    loaded = io.load(tags[0])
    out: dict[str, Any] = {
        "tags": tags,
        "before": before,
        "loaded": loaded,
        "step": trainer.step,
        "restored": state_digest(trainer),
    }
    for bad in ("step-99", "latest"):
        try:
            io.load(bad)
            out[bad] = "loaded"
        except CheckpointError as exc:
            out[bad] = str(exc)
    out["latest"] = bool(io.load(None)) and trainer.step == int(tags[-1].split("-")[1])
    return out


# -- replay under tensor parallelism ---------------------------------------------------


def _gather_tp(t: torch.Tensor, dim: int, pg: Any) -> torch.Tensor:
    """Test-side stand-in for the core seam: all-gather along ``dim`` on SCOUT's group."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(parts, t.contiguous(), group=pg)
    return torch.cat(parts, dim)


def _full(t: Any, pg: Any) -> Any:
    """A DTensor's full value, gathered on ``pg`` along its ``tp`` shard dim only."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    local = t.to_local().detach()
    names = t.device_mesh.mesh_dim_names or ()
    for name, placement in zip(names, t.placements, strict=True):
        if name == "tp" and placement.is_shard():
            local = _gather_tp(local, placement.dim, pg)
    return local.clone()


def _unchanged_machinery(trainer: Any, tl: Any, layer: Any, groups: Any) -> dict[str, Any]:
    """1. The core's twin and ``materialize`` as they are today, on a TorchTitan block."""
    from scout_torchtitan.replay import parallel_forwards

    from scout_core.plugin_api import (
        Discovered,
        ModuleRef,
        TorchAdapter,
        hook_free_twin,
        param_items,
    )

    out: dict[str, Any] = {}
    block = layer.block
    # The twin keeps TorchTitan's instance-level parallel forwards, and materialize
    # refuses the (size-1) FSDP mesh dim every parameter carries.
    out["twin_parallel_forwards"] = parallel_forwards(hook_free_twin(block))
    found = Discovered(layers=(ModuleRef(layer.path, block),), embedding=None, lm_head=None)
    adapter = TorchAdapter(trainer.model_parts[0], trainer.optimizers, found, mesh=tl.layout)
    adapter.bind_groups(groups)
    try:
        with adapter.materialize(ModuleRef(layer.path, block)):
            out["materialize"] = "ok"
    except Exception as exc:  # the finding is the exception
        out["materialize"] = f"{type(exc).__name__}: {exc}"
    adapter.close()
    out["placements"] = sorted(
        {str(tuple(repr(p) for p in t.placements)) for _, t in param_items(block)}
    )
    out["dtensor_buffers"] = sorted(
        n for n, b in block.named_buffers() if type(b).__name__ == "DTensor"
    )
    return out


def tp_replay(trainer: Any) -> dict[str, Any]:
    """Can the core's hook-free replay run a TorchTitan block under TP (item 6)?

    Captures layer 1's inputs in a forward, runs the block normally (through its
    FSDP/AC wrapper), then tries the core's machinery unchanged and with the
    TorchTitan-specific fixes the plugin needs (``detach_titan_parallelism``).
    """
    from scout_torchtitan.layout import titan_layout
    from scout_torchtitan.modules import find_titan_modules
    from scout_torchtitan.replay import detach_titan_parallelism, parallel_forwards
    from torch.distributed.tensor.debug import CommDebugMode

    from scout_core.plugin_api import create_peer_groups, hook_free_twin, param_items

    out: dict[str, Any] = {}
    model = trainer.model_parts[0]
    tl = titan_layout(trainer.parallel_dims)
    layer = find_titan_modules(trainer.model_parts).layers[1]
    block = layer.block
    seen: dict[str, Any] = {}
    handle = block.register_forward_pre_hook(
        lambda m, a, k: seen.setdefault("in", (a, k)), with_kwargs=True
    )
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        model(tokens)
    handle.remove()
    args, kwargs = seen["in"]
    out["input"] = [type(args[0]).__name__, [repr(p) for p in args[0].placements]]
    with torch.no_grad(), CommDebugMode() as comm:
        normal = layer.outer(*args, **kwargs)
    out["normal_comms"] = comm.get_total_counts()

    groups = create_peer_groups(tl.layout, tl.rank, kinds=("replica", "t"))
    tpg = groups["t"].pg
    out.update(_unchanged_machinery(trainer, tl, layer, groups))
    # 2. With the plugin's fix on the twin and full tensors gathered on SCOUT's TP group
    #    (test-side stand-in for the core seam), the replay is local and matches.
    state = {n: _full(p, tpg) for n, p in param_items(block)}
    state.update({n: _full(b, tpg) for n, b in block.named_buffers()})
    twin = detach_titan_parallelism(hook_free_twin(block))
    full_args = tuple(_full(a, tpg) for a in args)
    with torch.no_grad(), CommDebugMode() as comm:
        replay = torch.func.functional_call(twin, state, full_args, kwargs)
    out["replay_comms"] = comm.get_total_counts()
    reference = _full(normal, tpg)
    out["replay_type"] = type(replay).__name__
    out["max_abs_diff"] = float((replay - reference).abs().max())
    out["replay_sha"] = _sha(replay)
    out["live_still_parallel"] = bool(parallel_forwards(block))
    return out
