"""The rank body of a ``scout campaign`` trial under DeepSpeed: ZeRO 1/2/3 and pipeline.

:data:`SETUPS` (entry point ``scout.campaign_setups`` / ``deepspeed``) names this body for
``deepspeed-zero1/2/3`` and ``deepspeed-pipeline`` (two stages x DP 2). It builds a DeepSpeed
engine on CPU/Gloo around :class:`scout_core.testing.TinyLM` (or its layers as a
``PipelineModule``), with the trial's settings as the ``"scout"`` section, arms the fault
(:class:`scout_core.testing.TrialFault`) and trains. Under ZeRO-3 a parameter SDC strikes
this rank's partition (``ds_tensor``); the optimizer state is the inner optimizer's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing import VOCAB, Block, Setup, TinyLM, TrialFault, batch

__all__ = ["SETUPS", "trial_rank"]

_BODY = f"{__name__}:trial_rank"
_REQUIRES = ("deepspeed", "scout_deepspeed")

SETUPS: tuple[Setup, ...] = (
    *(
        Setup(f"deepspeed-zero{stage}", 4, _BODY, _REQUIRES, {"zero_stage": stage}, 150.0)
        for stage in (1, 2, 3)
    ),
    Setup("deepspeed-pipeline", 4, _BODY, _REQUIRES, {"pipeline": 2}, 150.0),
)

MICRO = 4
DIM = 16


def _storage(param: Any) -> torch.Tensor:
    part = getattr(param, "ds_tensor", None)
    return part if part is not None else param.data  # type: ignore[no-any-return]


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed(tokens)
        return out


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(x))
        return out


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def _config(stage: int, scout: dict[str, Any], dp: int, accumulation: int) -> dict[str, Any]:
    return {
        "train_batch_size": MICRO * dp * accumulation,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10_000,
        "scout": scout,
    }


def _engine(options: dict[str, Any], scout: dict[str, Any]) -> tuple[Any, nn.Module, int]:
    """(the engine, the module its layers are named in, this rank's data index)."""
    import deepspeed

    import scout_deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    stages = int(options.get("pipeline", 0))
    if stages:
        from deepspeed.pipe import PipelineModule

        layers = [_Embed(), *(Block(DIM) for _ in range(4)), _Head()]
        module: nn.Module = PipelineModule(
            layers=layers, num_stages=stages, loss_fn=_lm_loss, partition_method="uniform"
        )
        cfg = _config(1, scout, world // stages, 2)
    else:
        module = TinyLM()
        cfg = _config(int(options["zero_stage"]), scout, world, 1)
    engine, *_ = scout_deepspeed.initialize(
        model=module, model_parameters=module.parameters(), config=cfg
    )
    data = engine.grid.get_data_parallel_id() if stages else rank
    return engine, engine.module, data


def trial_rank(trial: dict[str, Any], report_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """One rank of a trial; returns :meth:`TrialFault.result` plus the steps trained."""
    import scout_deepspeed
    from scout_deepspeed.adapter import inner_optimizer

    fault = TrialFault(trial["fault"])  # before SCOUT attaches: see TrialFault's test kinds
    engine, module, data = _engine(options, dict(trial["scout"]))
    session = scout_deepspeed.session_of(engine)
    adapter = scout_deepspeed.plugin.adapter_of(engine)
    if session is None or adapter is None:
        raise RuntimeError("SCOUT did not attach to the DeepSpeed engine")
    layers = [ref.path for ref in adapter.repeated_layers()]
    first = layers[0]  # the first parameter of the first repeated block, as in every setup
    param = f"{first}.{next(n for n, _ in module.get_submodule(first).named_parameters())}"
    fault.prepare()
    fault.attach(module, inner_optimizer(engine), layers=layers, param=param, storage=_storage)
    pipeline = bool(options.get("pipeline"))
    trained = 0
    for step in fault.batches(session, int(trial["steps"])):
        fault.before_step(step)
        if pipeline:
            engine.train_batch(data_iter=_micro_batches(step, data))
        else:
            tokens = batch(step, data, size=MICRO)
            logits = engine(tokens[:, :-1])
            engine.backward(_lm_loss(logits, tokens[:, 1:]))
            engine.step()
        fault.after_step(step, session)
        trained += 1
    fault.detach()
    session.close()
    return fault.result() | {"trained": trained}


def _micro_batches(step: int, data: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for micro in range(2):
        tokens = batch(2 * step + micro, data, size=MICRO)
        yield tokens[:, :-1], tokens[:, 1:]
