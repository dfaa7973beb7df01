"""Rank bodies for the checkpoint-gate and conformance tests (DP x TP2, real dist_checkpointing).

``certify_then_sdc`` (job 1) and ``recover_fresh`` (job 2, new processes) share a
directory. With ``recipes = ["hidden"]`` the gate's catalog is the two layers
(K = 2): a recipe cycle closes at steps 1, 3, 5, ...

* step 1: the first cycle closes clean; ``iter_0000002`` is saved there -> candidate;
* step 3: the second cycle closes clean -> ``iter_0000002`` verified; ``iter_0000004``
  saved -> candidate;
* from step 4 rank 4 flips the lowest bit of ``decoder.layers.1``'s output; step 4
  replays layer 0 (clean), ``iter_0000005`` saved -> latest;
* step 5 replays layer 1 -> SDC naming rank 4; the newer tags become suspect and the
  save of iteration 6 is refused (nothing written).

Job 2 starts from other weights, recovers after ``sdc`` (the newest verified tag,
``iter_0000002``, bitwise as job 1 saved it), then trains on to iteration 4 and
reaches job 1's ``iter_0000004`` state bitwise.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from mg_scout_scenarios import build, faults_from, section, verdict_rows


def _config() -> Any:
    from scout_core import Config

    return Config(**section(recipes=["hidden"], observer=True))


def _roles(directory: str) -> dict[str, str]:
    torch.distributed.barrier()  # rank 0 writes the sidecar
    with open(os.path.join(directory, "scout-certification.json"), encoding="utf-8") as fh:
        return {t["tag"]: t["role"] for t in json.load(fh)["tags"]}


def certify_then_sdc(directory: str) -> dict[str, Any]:
    import scout_megatron
    from scout_megatron import testing as mgt

    spec, model, ddp, opt = build()
    session = scout_megatron.attach([ddp], opt, _config())
    faults = [{"kind": "sdc", "rank": 4, "start": 4, "targets": ["decoder.layers.1"]}]
    injector = faults_from(faults, 100).attach(model, opt.chained_optimizers[0].optimizer)
    io = mgt.CpuCheckpointIO(directory, [ddp], opt)
    out: dict[str, Any] = {"saved": {}, "digests": {}, "roles": {}}

    def train_to(step: int) -> None:
        while session.step <= step:
            mgt.train_step(ddp, opt, mgt.get_batch(spec, session.step))

    def save(iteration: int | None = None) -> None:
        name = f"iter_{iteration if iteration is not None else session.step:07d}"
        out["saved"][name] = scout_megatron.save_checkpoint(io, iteration)
        out["digests"][name] = mgt.digest(model, opt)

    train_to(1)
    save()  # iteration 2, at the first clean cycle close
    out["roles"]["1"] = _roles(directory)
    train_to(3)
    save()
    out["roles"]["3"] = _roles(directory)
    train_to(4)
    save()
    train_to(5)
    out["verdicts"] = verdict_rows(session.verdicts)
    save(6)  # refused
    out["roles"]["5"] = _roles(directory)
    out["listed"] = io.list_tags()
    out["iter_6_exists"] = os.path.exists(os.path.join(directory, "iter_0000006"))
    injector.detach()
    session.close()
    mgt.teardown()
    return out


def recover_fresh(directory: str) -> dict[str, Any]:
    import scout_megatron
    from scout_megatron import testing as mgt

    spec, model, ddp, opt = build(seed=99)  # other weights: the restore has work to do
    session = scout_megatron.attach([ddp], opt, _config())
    io = mgt.CpuCheckpointIO(directory, [ddp], opt)
    out: dict[str, Any] = {"fresh": mgt.digest(model, opt)}
    out["recovered"] = list(scout_megatron.recover(io, "sdc"))
    out["recovered_digest"] = mgt.digest(model, opt)
    out["step_after"] = session.step
    while session.step <= 3:  # iterations 3 and 4, as job 1 trained them
        mgt.train_step(ddp, opt, mgt.get_batch(spec, session.step))
    out["trained_digest"] = mgt.digest(model, opt)
    out["loaded_default"] = scout_megatron.load_checkpoint(io)  # newest verified, again
    out["loaded_digest"] = mgt.digest(model, opt)
    session.close()
    mgt.teardown()
    return out


def conformance(directory: str) -> dict[str, Any]:
    """The core's shared conformance bodies against the plugin, its adapter and its IO."""
    from contextlib import contextmanager

    import scout_megatron
    from megatron.core import dist_checkpointing
    from scout_megatron import testing as mgt

    from scout_core.testing import check_adapter, check_checkpoint_io, check_plugin

    spec, model, ddp, opt = build()
    check_plugin(scout_megatron.plugin, [model])
    session = scout_megatron.attach([ddp], opt, _config())
    check_adapter(session.adapter)
    adapter = session.adapter
    inner = opt.chained_optimizers[0].optimizer
    steps = [0]

    def advance() -> None:
        mgt.train_step(ddp, opt, mgt.get_batch(spec, steps[0]))
        steps[0] += 1

    def state() -> list[torch.Tensor]:
        slots = [v for s in inner.state.values() for _, v in sorted(s.items())]
        return [p.detach() for p in model.parameters()] + [v for v in slots if v.dim() > 0]

    @contextmanager
    def failing_saves() -> Any:
        """Every rank's dist_checkpointing.save raises (a full disk): nothing is written."""
        original = dist_checkpointing.save

        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError("disk full (injected)")

        dist_checkpointing.save = broken
        try:
            yield
        finally:
            dist_checkpointing.save = original

    io = mgt.CpuCheckpointIO(directory, [ddp], opt)
    advance()
    check_checkpoint_io(io, state=state, advance=advance, break_save=failing_saves)
    layer = adapter.repeated_layers()[0]
    recorded = _bridge_save_is_recorded(directory + "-bridge", [ddp], opt, steps[0])
    out = {
        "recorded": recorded,
        "tags": io.list_tags(),
        "writes": io.writes_metadata(),
        "layers": [r.path for r in adapter.repeated_layers()],
        "special": sorted(adapter.special_modules()),
        "ownership": adapter.optimizer_ownership().value,
        "streams": [s.name for s in adapter.rng_streams()],
        "groups": sorted(adapter.training_groups()),
        "address": [getattr(adapter.address(), axis) for axis in "dstpce"],
        "replay_groups": {k: [list(v[0]), v[1]] for k, v in adapter.replay_groups(layer).items()},
        "embedding_groups": {
            k: [list(v[0]), v[1]]
            for k, v in adapter.replay_groups(adapter.special_modules()["embedding"]).items()
        },
    }
    session.close()
    mgt.teardown()
    return out


def _bridge_save_is_recorded(directory: str, chunks: list[Any], opt: Any, step: int) -> Any:
    """``ScoutCallback.on_checkpoint_save`` (fired by Bridge releases that have it, after
    Bridge wrote the checkpoint) records that checkpoint in the gate's ledger."""
    from types import SimpleNamespace

    import scout_megatron
    from scout_megatron import testing as mgt

    state = SimpleNamespace(
        cfg=SimpleNamespace(checkpoint=SimpleNamespace(save=directory)),
        train_state=SimpleNamespace(step=step),
    )
    context = SimpleNamespace(state=state, model=chunks, optimizer=opt, user_state={})
    callback = scout_megatron.ScoutCallback(_config())
    callback.on_train_start(context)  # the live session: attaching twice returns it
    assert context.user_state["scout"] is scout_megatron.session_of(chunks)
    mgt.CpuCheckpointIO(directory, chunks, opt).save(f"iter_{step:07d}")  # "Bridge" saves
    callback.on_checkpoint_save(context)
    return _roles(directory)


class BridgeDefaultStandIn:
    """Bridge's ``DefaultCheckpointManager`` on CPU (its module imports Bridge's CUDA-only
    dependencies): the same protocol, writing Megatron-LM's ``iter_NNNNNNN`` of
    ``ctx.state.train_state.step`` with real ``dist_checkpointing``, loading
    ``ckpt_step`` (else the tracker's tag) and returning ``(iteration, 0)``."""

    def __init__(self, checkpoint_config: Any) -> None:
        self.checkpoint_config = checkpoint_config

    def _io(self, ctx: Any, directory: str) -> Any:
        from scout_megatron import testing as mgt

        return mgt.CpuCheckpointIO(directory, ctx.model, ctx.optimizer)

    def save(self, ctx: Any, callback_manager: Any) -> None:
        io = self._io(ctx, self.checkpoint_config.save)
        io.save(f"iter_{ctx.state.train_state.step:07d}")

    def load(self, ctx: Any) -> tuple[int, int]:
        step = self.checkpoint_config.ckpt_step
        io = self._io(ctx, self.checkpoint_config.load)
        return io.load(None if step is None else f"iter_{step:07d}"), 0

    def finalize_async_saves(
        self, state: Any, blocking: bool = False, terminate: bool = False
    ) -> None:
        return None


def _bridge(directory: str, chunks: list[Any], opt: Any, step: int) -> tuple[Any, Any]:
    """A ScoutCheckpointManager over the stand-in, and a Bridge context at ``step``."""
    from types import SimpleNamespace

    from scout_megatron.bridge_checkpoint import ScoutCheckpointManager

    config = SimpleNamespace(save=directory, load=directory, ckpt_step=None)
    manager = ScoutCheckpointManager(config, inner=BridgeDefaultStandIn(config))
    state = SimpleNamespace(train_state=SimpleNamespace(step=step))
    return manager, SimpleNamespace(state=state, model=chunks, optimizer=opt)


def bridge_certify_then_sdc(directory: str) -> dict[str, Any]:
    """``certify_then_sdc`` with every save made by Bridge's manager seam."""
    import scout_megatron
    from scout_megatron import testing as mgt

    spec, model, ddp, opt = build()
    session = scout_megatron.attach([ddp], opt, _config())
    faults = [{"kind": "sdc", "rank": 4, "start": 4, "targets": ["decoder.layers.1"]}]
    injector = faults_from(faults, 100).attach(model, opt.chained_optimizers[0].optimizer)
    out: dict[str, Any] = {"saved": [], "digests": {}, "roles": {}}

    def train_to(step: int) -> None:
        while session.step <= step:
            mgt.train_step(ddp, opt, mgt.get_batch(spec, session.step))

    def save() -> None:  # Bridge saves after its step counter moved: iteration == step
        manager, ctx = _bridge(directory, [ddp], opt, session.step)
        manager.save(ctx, None)
        out["saved"].append(session.step)
        out["digests"][f"iter_{session.step:07d}"] = mgt.digest(model, opt)

    train_to(1)
    save()
    train_to(3)
    save()
    train_to(4)
    save()
    train_to(5)
    out["verdicts"] = verdict_rows(session.verdicts)
    session_step = session.step
    save()  # iteration 6: refused
    out["roles"]["5"] = _roles(directory)
    out["iter_6_exists"] = os.path.exists(os.path.join(directory, f"iter_{session_step:07d}"))
    injector.detach()
    session.close()
    mgt.teardown()
    return out


def bridge_load_fresh(directory: str) -> dict[str, Any]:
    """A new job loads through Bridge's manager seam: the newest verified tag."""
    import scout_megatron
    from scout_megatron import testing as mgt

    from scout_core import Config

    _spec, model, ddp, opt = build(seed=99)
    # A load needs the gate, not the hang observer (one process fewer per rank).
    session = scout_megatron.attach([ddp], opt, Config(**section(recipes=["hidden"])))
    manager, ctx = _bridge(directory, [ddp], opt, 0)
    out: dict[str, Any] = {"fresh": mgt.digest(model, opt)}
    out["loaded"] = list(manager.load(ctx))
    out["loaded_digest"] = mgt.digest(model, opt)
    out["step_after"] = session.step
    session.close()
    mgt.teardown()
    return out
