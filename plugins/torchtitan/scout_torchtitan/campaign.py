"""The rank body of a ``scout campaign`` trial under TorchTitan (``dp_replicate`` x TP on CPU).

Contract: the ``torchtitan`` setup (:data:`SETUPS`; ``dp_replicate`` 3 x TP 2) runs this body on
every rank without initialising the process group (TorchTitan does). It builds the real ``Trainer``
with SCOUT on through the override and drives the fault from public hooks (a step's first forward,
the optimizers' post-step hook, a watched loader) while ``trainer.train()`` loops. docs/campaign.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scout_core.testing import Setup

__all__ = ["SETUPS", "trial_rank"]

SETUPS: tuple[Setup, ...] = (
    Setup(
        "torchtitan",
        6,
        f"{__name__}:trial_rank",
        ("torchtitan", "scout_torchtitan"),
        {"tp": 2},
        240.0,
        init_process_group=False,
    ),
)


class _Stalled:
    """TorchTitan's dataloader, whose ``slow``-th fetch sleeps ``seconds`` (-1: never)."""

    def __init__(self, loader: Any, slow: int, seconds: float, on_stall: Any) -> None:
        self.loader, self.slow, self.seconds, self.on_stall = loader, slow, seconds, on_stall

    def __iter__(self) -> Iterator[Any]:
        for i, item in enumerate(self.loader):
            if i == self.slow:
                self.on_stall()
                time.sleep(self.seconds)
            yield item

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Driver:
    """Calls the fault's per-step methods from the model's and optimizer's hooks."""

    def __init__(self, fault: Any, session: Any) -> None:
        self.fault, self.session = fault, session
        self.step, self.started, self.trained = 0, False, 0

    def before_forward(self, *_: Any) -> None:
        if not self.started:
            self.started = True
            self.fault.before_step(self.step)

    def after_step(self, *_: Any) -> None:
        self.fault.after_step(self.step, self.session)
        self.step, self.started, self.trained = self.step + 1, False, self.trained + 1


def trial_rank(trial: dict[str, Any], report_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """One rank of a trial; returns :meth:`TrialFault.result` plus the steps trained."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    scratch = Path(tempfile.mkdtemp(prefix=f"scout-titan-campaign-{rank}-"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(scratch / "hf"))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from scout_torchtitan.testing import install_cpu_shims, titan_argv, write_assets

    install_cpu_shims()  # before TorchTitan's trainer modules are imported
    import torch.distributed as dist
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger

    import scout_torchtitan
    from scout_core.testing import TrialFault
    from scout_torchtitan.modules import titan_modules
    from scout_torchtitan.testing.faults import block_paths

    tp = int(options.get("tp", 2))
    argv = titan_argv(
        write_assets(scratch / "assets"),
        steps=int(trial["steps"]),
        dp_replicate=max(1, world // tp),
        tp=tp,
        dump_folder=str(scratch / "dump"),
        extra=[
            "--override.imports",
            f"scout_torchtitan.overrides.scout={json.dumps(trial['scout'])}",
        ],
    )
    init_logger()
    trainer = ConfigManager().parse_args(argv).build()  # SCOUT attaches in here
    session = scout_torchtitan.session_of(trainer)
    fault = TrialFault(trial["fault"], rank=rank)
    fault.prepare()
    model = trainer.model_parts[0]
    blocks = block_paths(model, [ref.module for ref in titan_modules(trainer.model_parts).layers])
    inner = trainer.optimizers.optimizers[0]
    first = blocks[0]  # the first parameter of the first repeated block, as in every setup
    param = f"{first}.{next(n for n, _ in model.get_submodule(first).named_parameters())}"
    fault.attach(model, inner, layers=blocks, param=param)
    driver = _Driver(fault, session)
    slow = fault.step if fault.mine and fault.kind == "input_stall" else -1
    stalled = _Stalled(trainer.dataloader, slow, fault.stall_s, fault.mark_injected)
    trainer.dataloader = stalled if session is None else session.watch_dataloader(stalled)
    handles = [
        model.register_forward_pre_hook(driver.before_forward),
        trainer.optimizers.register_step_post_hook(driver.after_step),
    ]
    try:
        trainer.train()
    finally:
        for h in handles:
            h.remove()
        fault.detach()
        trainer.close()  # closes SCOUT's session: this rank's evidence is on disk
        if dist.is_initialized():
            dist.barrier()  # TorchTitan's store lives in rank 0: nobody leaves early
            dist.destroy_process_group()
        shutil.rmtree(scratch, ignore_errors=True)
    return fault.result() | {"trained": driver.trained}
