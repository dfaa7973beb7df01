"""Run a real TorchTitan ``Trainer`` inside one test rank and report what it trained.

:func:`run_trainer` follows ``torchtitan.train.main`` step for step (logger,
``ConfigManager().parse_args``, ``config.build()``, ``trainer.train()``,
``trainer.close()``, process-group teardown) with the CPU shims installed first,
and returns a JSON-able summary instead of nothing, so a test driving it through
:func:`scout_core.testing.run_ranks` (``init_process_group=False``: TorchTitan
initialises torch.distributed itself from ``MASTER_ADDR``/``RANK``/...) can compare
runs bitwise. :func:`titan_argv` builds the command line a user would type.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from typing import Any

import torch

from scout_torchtitan.testing.assets import TitanAssets
from scout_torchtitan.testing.shims import install_cpu_shims

__all__ = ["launch_main", "run_trainer", "state_digest", "titan_argv"]


def titan_argv(
    assets: TitanAssets,
    *,
    steps: int = 4,
    dp_replicate: int = 1,
    dp_shard: int = 1,
    tp: int = 1,
    dump_folder: str | None = None,
    config: str = "tiny_llama3",
    extra: Sequence[str] = (),
) -> list[str]:
    """``--module scout_torchtitan.testing --config <config>`` plus the usual flags.

    Always ``partial_dtensor``: the default ``spmd_types`` backend does not train on
    Gloo with more than one rank (FRAMEWORKS.md 3.5).
    """
    argv = [
        "--module",
        "scout_torchtitan.testing",
        "--config",
        config,
        *assets.cli_args(),
        "--training.steps",
        str(steps),
        "--parallelism.spmd_backend",
        "partial_dtensor",
        "--parallelism.data_parallel_replicate_degree",
        str(dp_replicate),
        "--parallelism.data_parallel_shard_degree",
        str(dp_shard),
        "--parallelism.tensor_parallel_degree",
        str(tp),
    ]
    if dump_folder is not None:
        argv += ["--dump_folder", dump_folder]
    return [*argv, *extra]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    out = to_local() if callable(to_local) else t
    assert isinstance(out, torch.Tensor)
    return out.detach().cpu().contiguous()


def _hash_tree(h: Any, obj: Any, prefix: str = "") -> None:
    if isinstance(obj, torch.Tensor):
        t = _local(obj)
        h.update(f"{prefix}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _hash_tree(h, obj[key], f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _hash_tree(h, item, f"{prefix}/{i}")
    else:
        h.update(f"{prefix}={obj!r}".encode())


def state_digest(trainer: Any) -> dict[str, str]:
    """sha256 of this rank's model parameters and optimizer state (local shards)."""
    model = hashlib.sha256()
    for i, part in enumerate(trainer.model_parts):
        _hash_tree(model, dict(part.state_dict()), f"part{i}")
    optim = hashlib.sha256()
    for i, opt in enumerate(trainer.optimizers.optimizers):
        _hash_tree(optim, opt.state_dict()["state"], f"opt{i}")
    return {"model": model.hexdigest(), "optimizer": optim.hexdigest()}


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def run_trainer(
    argv: Sequence[str], *, train: bool = True, inspect: str | None = None
) -> dict[str, Any]:
    """Build TorchTitan's ``Trainer`` from ``argv`` and train it, as ``torchtitan.train`` does.

    Returns ``{"step", "digest", "inspect"}``: the last step, :func:`state_digest`
    after training, and ``inspect``'s result when given (``"module:function"``,
    called with the live trainer after training, or instead of it when ``train``
    is false). Runs inside a rank with ``RANK``/``WORLD_SIZE``/``MASTER_*`` set.
    """
    install_cpu_shims()
    import torch.distributed as dist
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger

    init_logger()
    config = ConfigManager().parse_args(list(argv))
    trainer = config.build()
    result: dict[str, Any] = {}
    try:
        if train:
            trainer.train()
        result["step"] = int(trainer.step)
        result["digest"] = state_digest(trainer)
        if inspect is not None:
            result["inspect"] = _resolve(inspect)(trainer)
    finally:
        trainer.close()
    if dist.is_initialized():
        # TorchTitan's rendezvous store lives in rank 0's process: rank 0 must not
        # exit while a slower rank still talks to it (e.g. creating process groups).
        dist.barrier()
        dist.destroy_process_group()
    return result


def launch_main(argv: Sequence[str]) -> list[dict[str, Any]]:
    """Run TorchTitan's real entry point (``torchtitan.train.main``) on ``argv`` in this rank.

    What ``torchrun -m scout_torchtitan.testing.launch ARGV`` runs, inside a
    :func:`scout_core.testing.run_ranks` rank. ``main`` returns nothing, so this
    returns what SCOUT's checkpoint manager recorded in this process
    (:func:`scout_torchtitan.manager.built`; empty when SCOUT was not switched on).
    """
    import sys

    install_cpu_shims()
    from scout_torchtitan.testing.launch import main

    saved = sys.argv
    sys.argv = ["scout_torchtitan.testing.launch", *argv]
    try:
        main()
    finally:
        sys.argv = saved
    if "scout_torchtitan.manager" not in sys.modules:
        return []
    from scout_torchtitan.manager import built

    return built()
