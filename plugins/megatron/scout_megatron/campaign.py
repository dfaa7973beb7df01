"""The rank body of a ``scout campaign`` trial under Megatron-Core (DP x TP on CPU).

:data:`SETUPS` (entry point ``scout.campaign_setups`` / ``megatron``) names this body for the
``megatron`` setup, DP 3 x TP 2: a megatron-core ``GPTModel`` (:mod:`scout_megatron.testing`'s
tiny GPT with its CPU shims: torch DDP over Megatron's data-parallel group, ``ChainedOptimizer``),
SCOUT attached with :func:`scout_megatron.attach`, and the trial's fault armed with
:class:`scout_core.testing.TrialFault`.
"""

from __future__ import annotations

import warnings
from typing import Any

from scout_core.testing import Setup

__all__ = ["SETUPS", "trial_rank"]

SETUPS: tuple[Setup, ...] = (
    Setup(
        "megatron", 6, f"{__name__}:trial_rank", ("megatron", "scout_megatron"), {"tp": 2}, 240.0
    ),
)


def trial_rank(trial: dict[str, Any], report_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """One rank of a trial; returns :meth:`TrialFault.result` plus the steps trained."""
    warnings.filterwarnings("ignore", module="megatron")  # "Apex is not installed" ...
    import scout_megatron
    from scout_core import Config
    from scout_core.testing import TrialFault
    from scout_megatron import testing as mgt

    mgt.initialize(tensor_model_parallel_size=int(options.get("tp", 2)))
    spec = mgt.TinyGPT()
    model = mgt.build_model(spec)
    ddp = mgt.wrap_ddp(model)
    optimizer = mgt.build_optimizer([model])
    fault = TrialFault(trial["fault"])
    fault.prepare()
    session = scout_megatron.attach([ddp], optimizer, Config(**trial["scout"]))
    inner = optimizer.chained_optimizers[0].optimizer
    layers = [
        name
        for name, _ in model.named_modules()
        if name.startswith("decoder.layers.") and name.count(".") == 2
    ]
    first = layers[0]  # the first parameter of the first repeated block, as in every setup
    param = f"{first}.{next(n for n, _ in model.get_submodule(first).named_parameters())}"
    fault.attach(model, inner, layers=layers, param=param)
    trained = 0
    try:
        for step in fault.batches(session, int(trial["steps"])):
            fault.before_step(step)
            mgt.train_step(ddp, optimizer, mgt.get_batch(spec, step))
            fault.after_step(step, session)
            trained += 1
    finally:
        fault.detach()
        session.close()
        mgt.teardown()
    return fault.result() | {"trained": trained}
