"""Rank bodies for the training tests (run through ``scout_core.testing.run_ranks``)."""

from __future__ import annotations

from typing import Any


def train_twice(steps: int, dropout: float) -> dict[str, Any]:
    """Train the tiny GPT from the same seed twice in one process; digests and losses."""
    from megatron.core import parallel_state
    from scout_megatron import testing as mgt

    mgt.initialize(tensor_model_parallel_size=2)
    spec = mgt.TinyGPT(dropout=dropout)
    runs = []
    for _ in range(2):
        mgt.install_cpu_shims(1234)
        model = mgt.build_model(spec)
        ddp = mgt.wrap_ddp(model)
        opt = mgt.build_optimizer([model])
        losses = [mgt.train_step(ddp, opt, mgt.get_batch(spec, s)) for s in range(steps)]
        runs.append({"digest": mgt.digest(model, opt), "losses": losses})
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
    mgt.teardown()
    return out
