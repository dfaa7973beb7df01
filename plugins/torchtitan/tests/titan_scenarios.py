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
    """Layout, modules and optimizers as the plugin reads them off the trainer."""
    from scout_torchtitan.layout import titan_layout
    from scout_torchtitan.modules import titan_modules
    from scout_torchtitan.optimizers import titan_optimizers

    tl = titan_layout(trainer.parallel_dims)
    mods = titan_modules(trainer.model_parts)
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
        "block": sorted({type(layer.module).__name__ for layer in mods.layers}),
        "embedding": None if mods.embedding is None else mods.embedding.path,
        "lm_head": None if mods.lm_head is None else mods.lm_head.path,
        "container": type(opts.container).__name__,
        "container_is_optimizer": isinstance(opts.container, torch.optim.Optimizer),
        "per_part": [[p.part, type(p.optimizer).__name__] for p in opts.per_part],
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


def tp_replay(trainer: Any) -> dict[str, Any]:
    """Replay one TorchTitan block under TP through the plugin's adapter (no session).

    Captures layer 1's call the way replay does (hooks on the wrapper, inputs kept
    through the ref's ``capture_copy``), runs the block normally through its
    FSDP/AC wrapper, then materialises the parameters and calls the adapter's
    hook-free twin on the captured inputs: the call must issue no collective and
    match the normal output, and every rank must compute the same bits.
    """
    from scout_torchtitan.adapter import TitanAdapter
    from scout_torchtitan.replay import parallel_forwards
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from scout_core import Config
    from scout_core.plugin_api import create_peer_groups

    out: dict[str, Any] = {}
    adapter = TitanAdapter(trainer, Config())
    layout = adapter.layout()
    adapter.bind_groups(create_peer_groups(layout, adapter.rank(), ["peer", "t"]))
    ref = adapter.repeated_layers()[1]
    assert ref.capture_copy is not None and ref.outer is not None
    seen: dict[str, Any] = {}

    def pre(module: Any, args: Any, kwargs: Any) -> None:
        if "raw" in seen:
            return
        assert ref.capture_copy is not None
        seen["raw"] = args[0]
        kept = [ref.capture_copy(a) if isinstance(a, torch.Tensor) else a for a in args]
        seen["in"] = (kept, dict(kwargs))

    handle = ref.hooked.register_forward_pre_hook(pre, with_kwargs=True)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        trainer.model_parts[0](tokens)
    handle.remove()
    raw = seen["raw"]
    out["input"] = [type(raw).__name__, [repr(p) for p in raw.placements]]
    args, kwargs = seen["in"]
    out["captured"] = [type(args[0]).__name__, list(args[0].shape)]
    with torch.no_grad(), CommDebugMode() as comm:
        normal = ref.hooked(raw, *args[1:], **kwargs)
    out["normal_comms"] = comm.get_total_counts()
    with adapter.materialize(ref) as params:
        state = dict(params)
    out["params_plain"] = all(not isinstance(t, DTensor) for t in state.values())
    state.update({k: b.clone() for k, b in ref.module.named_buffers()})
    out["dtensor_buffers"] = sorted(
        k for k, b in ref.module.named_buffers() if isinstance(b, DTensor)
    )
    with torch.no_grad(), CommDebugMode() as comm:
        replay = adapter.call(ref.module, state, tuple(args), kwargs)
    # the DTensor buffer (RoPE cache) is Replicate: made plain locally, no collective
    out["replay_comms"] = comm.get_total_counts()
    reference = adapter.full_tensor(normal)
    out["replay_type"] = type(replay).__name__
    out["max_abs_diff"] = float((replay - reference).abs().max())
    out["replay_sha"] = _sha(replay)
    out["live_still_parallel"] = bool(parallel_forwards(ref.module))
    adapter.close()
    return out


# -- SCOUT attached ----------------------------------------------------------------------


def scout_state(trainer: Any) -> dict[str, Any]:
    """What SCOUT attached and what replay did, read after training (session still open)."""
    from scout_torchtitan import session_of

    session = session_of(trainer)
    out: dict[str, Any] = {
        "seen": asdict(trainer.checkpointer.scout_seen)
        if hasattr(trainer.checkpointer, "scout_seen")
        else None,
        "enabled": session is not None and session.enabled,
    }
    if session is None or session.replay is None:
        return out
    out["step"] = session.step
    out["rounds"] = [
        {
            "recipe": o.recipe.name,
            "step": o.step,
            "ready": o.ready,
            "reason": o.reason,
            "results": {k: v.status.value for k, v in o.results.items()},
            "timings": {
                k: [round(float(e), 4) if isinstance(e, float) else None for e in v.evidence]
                for k, v in o.results.items()
                if v.mode.value == "statistical"
            },
        }
        for o in session.replay.history
    ]
    out["verdicts"] = [r.to_dict() for r in session.verdicts]
    return out


def train_with_fault(trainer: Any) -> dict[str, Any]:
    """Arm ``$SCOUT_TITAN_INJECT`` (``kind:rank=R,step=S``) on this rank, train, report."""
    import os

    from scout_torchtitan.testing.faults import attach_fault, parse_inject

    conformance: dict[str, Any] = {}
    if os.environ.get("SCOUT_TITAN_CONFORMANCE"):
        from scout_torchtitan import plugin, session_of

        from scout_core.testing import check_adapter, check_plugin

        session = session_of(trainer)
        assert session is not None and session.adapter is not None
        check_plugin(plugin, trainer)
        check_adapter(session.adapter)
        conformance = {"plugin": True, "adapter": type(session.adapter).__name__}
    spec = parse_inject(os.environ.get("SCOUT_TITAN_INJECT"))
    armed = attach_fault(
        spec,
        trainer,
        rank=dist.get_rank(),
        steps=trainer.config.training.steps,
        freeze_file=os.environ.get("SCOUT_TITAN_FREEZE_FILE"),
    )
    trainer.train()
    out = scout_state(trainer)
    out["fired"] = [] if armed is None else [list(f) for f in armed.fired()]
    out["conformance"] = conformance
    if armed is not None:
        armed.detach()
    return out


# -- the checkpoint gate -------------------------------------------------------------------


def _sidecar(directory: str) -> dict[str, str]:
    import json
    from pathlib import Path

    path = Path(directory) / "scout-certification.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {e["tag"]: e["role"] for e in data["tags"]}


def gate_sdc_then_recover(trainer: Any) -> dict[str, Any]:
    """Train with every step saved through SCOUT's gate; rank 2 turns faulty at
    ``$SCOUT_TITAN_SDC_STEP``; then recover in process through the gate."""
    import os

    from scout_torchtitan import recover, session_of
    from scout_torchtitan.testing import state_digest
    from scout_torchtitan.testing.faults import FaultSpec, attach_fault

    digests: dict[int, dict[str, str]] = {}
    trainer.optimizers.register_step_post_hook(
        lambda *_: digests.__setitem__(int(trainer.step), state_digest(trainer))
    )
    spec = FaultSpec("sdc", 2, int(os.environ["SCOUT_TITAN_SDC_STEP"]))
    armed = attach_fault(spec, trainer, rank=dist.get_rank(), steps=trainer.config.training.steps)
    trainer.train()
    assert armed is not None
    armed.detach()
    session = session_of(trainer)
    assert session is not None
    directory = trainer.checkpointer.folder
    before = _sidecar(directory)
    found = recover(trainer, "sdc")
    return {
        "digests": {str(k): v for k, v in digests.items()},
        "roles": before,
        "roles_after": _sidecar(directory),
        "verdicts": [r.to_dict() for r in session.verdicts],
        "recovered": list(found),
        "step_after_recover": int(trainer.step),
        "digest_after_recover": state_digest(trainer),
        "scout_step": session.step,
    }


def gate_load_fresh(trainer: Any) -> dict[str, Any]:
    """Fresh processes: TorchTitan's own start-of-training load, through SCOUT's gate."""
    from scout_torchtitan import session_of
    from scout_torchtitan.testing import state_digest

    before = state_digest(trainer)
    loaded = trainer.checkpointer.load(step=-1)  # what Trainer.train() calls first
    session = session_of(trainer)
    assert session is not None
    return {
        "before": before,
        "loaded": loaded,
        "step": int(trainer.step),
        "scout_step": session.step,
        "digest": state_digest(trainer),
    }


def checkpoint_io_conformance(trainer: Any) -> dict[str, Any]:
    """The core's shared ``check_checkpoint_io`` on ``TitanCheckpointIO`` over the live trainer.

    ``advance`` trains one more step through TorchTitan's ``train()`` (which first
    reloads the newest checkpoint: run with ``--checkpoint.load_only``, so every
    checkpoint on disk is the IO's); a broken save is the manager's DCP writer raising
    on every rank (a full disk).
    """
    from contextlib import contextmanager

    from scout_torchtitan.checkpoint_io import TitanCheckpointIO
    from torch.distributed.tensor import DTensor

    from scout_core.testing import check_checkpoint_io

    manager = trainer.checkpointer
    io = TitanCheckpointIO(manager)

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    def state() -> list[torch.Tensor]:
        out = [local(p.detach()) for part in trainer.model_parts for p in part.parameters()]
        for opt in trainer.optimizers.optimizers:
            for slots in opt.state.values():
                out += [local(v) for v in slots.values() if isinstance(v, torch.Tensor)]
        return out

    def advance() -> None:
        trainer.config.training.steps = int(trainer.step) + 1
        trainer.train()

    @contextmanager
    def break_save() -> Any:
        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError("disk full (injected)")

        manager.dcp_save = broken
        try:
            yield
        finally:
            del manager.dcp_save

    advance()
    check_checkpoint_io(io, state=state, advance=advance, break_save=break_save)
    return {"tags": list(io.list_tags()), "writes": io.writes_metadata()}
