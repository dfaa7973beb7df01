"""Rank bodies for the training tests (run through ``scout_core.testing.run_ranks``)."""

from __future__ import annotations

from typing import Any


def train_twice(steps: int, dropout: float) -> dict[str, Any]:
    """Train the tiny GPT from the same seed twice in one process; digests and losses."""
    from megatron.core import parallel_state

    from scout_megatron import testing as T

    T.initialize(tensor_model_parallel_size=2)
    spec = T.TinyGPT(dropout=dropout)
    runs = []
    for _ in range(2):
        T.install_cpu_shims(1234)
        model = T.build_model(spec)
        ddp = T.wrap_ddp(model)
        opt = T.build_optimizer([model])
        losses = [T.train_step(ddp, opt, T.get_batch(spec, s)) for s in range(steps)]
        runs.append({"digest": T.digest(model, opt), "losses": losses})
    types = [
        type(opt).__name__,
        type(opt.chained_optimizers[0]).__name__,
        type(opt.chained_optimizers[0].optimizer).__name__,
    ]
    out = {
        "runs": runs,
        "types": types,
        "tp": parallel_state.get_tensor_model_parallel_rank(),
        "dp": parallel_state.get_data_parallel_rank(),
    }
    T.teardown()
    return out
