"""Rank bodies for the framework-fact tests: modules, optimizers, RNG streams, recompute."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def _hook_counts(model: torch.nn.Module, layers: list[Any]) -> dict[str, list[int]]:
    from scout_megatron.rng import in_recompute

    counts = {str(number): [0, 0] for number, _ in layers}

    def make(number: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            counts[str(number)][1 if in_recompute() else 0] += 1

        return hook

    for number, layer in layers:
        layer.register_forward_hook(make(number))
    return counts


def facts_tp2() -> dict[str, Any]:
    """Modules, inner optimizers, tracker streams and recompute detection on a TP=2 GPT."""
    from megatron.core import optimizer as mcore_optimizer
    from scout_megatron import testing as mgt
    from scout_megatron.modules import chunk_modules
    from scout_megatron.optimizers import inner_optimizers
    from scout_megatron.rng import tracker_streams

    mgt.initialize(tensor_model_parallel_size=2)
    out: dict[str, Any] = {}
    for recompute in (False, True):
        mgt.install_cpu_shims(1234)
        spec = mgt.TinyGPT(dropout=0.1, recompute=recompute)
        model = mgt.build_model(spec)
        ddp = mgt.wrap_ddp(model)
        opt = mgt.build_optimizer([model])
        (chunk,) = chunk_modules([ddp])
        counts = _hook_counts(model, list(chunk.layers))
        mgt.train_step(ddp, opt, mgt.get_batch(spec, 0))
        out[f"hooks_recompute_{recompute}"] = {k: list(v) for k, v in counts.items()}
    out["chunk"] = {
        "root_is_model": chunk.root is model,
        "layers": [number for number, _ in chunk.layers],
        "layer_class": type(chunk.layers[0][1]).__name__,
        "embedding": type(chunk.embedding).__name__,
        "output_layer": type(chunk.output_layer).__name__,
        "shared": chunk.shared_output_weight,
    }

    inner = inner_optimizers(opt)
    out["inner"] = [(i.wrapper, type(i.optimizer).__name__, i.index, i.sharded) for i in inner]
    out["inner_is_live"] = inner[0].optimizer is opt.chained_optimizers[0].optimizer
    config = opt.chained_optimizers[0].config
    with mgt.cuda_factories_on_cpu():
        stub = mcore_optimizer.FP32Optimizer(None, config, None)
    second = mgt.build_optimizer([model]).chained_optimizers[0]
    chained = mcore_optimizer.ChainedOptimizer([opt.chained_optimizers[0], stub, second])
    out["stub_inner"] = len(inner_optimizers(stub))
    out["chained_inner"] = [(i.wrapper, i.index) for i in inner_optimizers(chained)]

    # Tracker streams: names, per-rank seeds, capture / restore reproduces dropout.
    streams = tracker_streams()
    out["streams"] = [s.name for s in streams]
    out["states"] = {s.name: _sha(s.get()) for s in streams}
    saved = {s.name: s.get() for s in streams}
    cpu = torch.get_rng_state()
    batch = mgt.get_batch(spec, 1)
    ddp.train()
    first = model(batch.tokens, batch.position_ids, batch.attention_mask, labels=batch.labels)
    moved = {s.name: not torch.equal(saved[s.name], s.get()) for s in streams}
    second_run = model(batch.tokens, batch.position_ids, batch.attention_mask, labels=batch.labels)
    out["dropout_varies"] = not torch.equal(first, second_run)
    for s in streams:
        s.set(saved[s.name])
    torch.set_rng_state(cpu)
    again = model(batch.tokens, batch.position_ids, batch.attention_mask, labels=batch.labels)
    out["moved"] = moved
    out["restored_bitwise"] = torch.equal(first, again)
    # get() hands out a copy: scribbling on it leaves the tracker's state alone.
    from megatron.core import tensor_parallel

    live = tensor_parallel.get_cuda_rng_tracker().get_states()["data-parallel-rng"]
    before = live.clone()
    streams[0].get().zero_()
    out["get_is_copy"] = torch.equal(live, before) and bool(before.any())
    mgt.teardown()
    return out
