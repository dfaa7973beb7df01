"""The rank body of a campaign trial under the core's own setups: DDP, FSDP2, HSDP, DP x TP.

:func:`trial_rank` runs on every rank of a trial: it builds
:class:`~scout_core.testing.TinyLM` under the setup's parallelism, enables SCOUT through the
torch plugin with ``trial["scout"]``, arms the trial's fault and trains.

The layouts are PyTorch's own recipes: ``ddp``, ``fsdp`` (``fully_shard`` per block, then
the root), ``hsdp`` (world/2 replicas of 2 shards), ``dptp`` (each block's ``fc1``/``fc2``
colwise/rowwise on a TP-2 sub-mesh, then DDP over ``dp``). SCOUT derives each layout itself.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing.models import TinyLM, train_step

__all__ = ["build", "trial_rank"]


def build(layout: str) -> tuple[nn.Module, nn.Module]:
    """(the module the loop calls, the unwrapped TinyLM) for ``layout``."""
    torch.manual_seed(0)
    world = dist.get_world_size()
    model = TinyLM()
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), model
    from torch.distributed.device_mesh import init_device_mesh

    if layout in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        if layout == "fsdp":
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        else:
            mesh = init_device_mesh(
                "cpu", (world // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard")
            )
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, model
    if layout == "dptp":
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )
        from torch.nn.parallel import DistributedDataParallel

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        for block in model.layers:
            parallelize_module(
                block, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
            )
        return DistributedDataParallel(model, device_mesh=mesh["dp"]), model
    raise ValueError(f"unknown layout {layout!r}")


def trial_rank(trial: dict[str, Any], report_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """One rank of a trial; returns :meth:`TrialFault.result` plus the steps trained."""
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.testing.trial import TrialFault

    rank = dist.get_rank()
    layout = str(options["layout"])
    wrapped, model = build(layout)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    fault = TrialFault(trial["fault"])
    fault.prepare()
    layers = [
        name
        for name, _ in model.named_modules()
        if name.count(".") == 1 and name.startswith("layers.")
    ]
    first = layers[0]  # the first parameter of the first repeated block, as in every setup
    param = f"{first}.{next(n for n, _ in model.get_submodule(first).named_parameters())}"
    fault.attach(wrapped, opt, layers=layers, param=param)
    data_rank = rank // 2 if layout == "dptp" else rank  # TP partners share a batch
    config = Config(**trial["scout"])
    trained = 0
    with enable_torch(wrapped, opt, config) as session:
        for step in fault.batches(session, int(trial["steps"])):
            fault.before_step(step)
            train_step(wrapped, opt, step, data_rank)
            fault.after_step(step, session)
            trained += 1
    fault.detach()
    return fault.result() | {"trained": trained}
