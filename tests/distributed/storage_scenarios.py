"""Rank bodies for SCOUT's own storage faults (``test_storage_failsafe.py``); each returns JSON.

A DDP TinyLM on 3 ranks with replay of one hidden layer every step and ``K = 1``, so
every clean boundary closes a recipe cycle and persists a candidate to
``checkpoint_dir``: the durable store writes at every step. Faults are either real
(a small or read-only tmpfs the test mounted) or injected on one rank at chosen
steps (an ``OSError`` or DCP's ``CheckpointException`` out of the DCP save).
"""

from __future__ import annotations

import errno
import os
import subprocess
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STEPS = 8


def _config(report_dir: str, checkpoint_dir: str | None, **over: Any) -> Any:
    import scout_core as scout

    values: dict[str, Any] = {
        "report_dir": report_dir,
        "run_id": "storage",
        "recipes": ("hidden",),
        "replay_interval": 1,
        "observer": False,
        "catalog_size": 1,
        "checkpoint_dir": checkpoint_dir,
    }
    values.update(over)
    return scout.Config(**values)


def _model() -> Any:
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.testing import TinyLM

    torch.manual_seed(0)
    ddp = DistributedDataParallel(TinyLM())
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-2)


def unwritable_at_enable(key: str, path: str, only_rank: int | None) -> dict[str, Any]:
    """``key`` points at ``path`` on ``only_rank`` (every rank when None); elsewhere at a
    writable directory. Returns what ``enable`` raised on this rank."""
    import scout_core as scout

    rank = dist.get_rank()
    good = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], key)
    chosen = path if only_rank is None or rank == only_rank else good
    cfg = _config(chosen, None) if key == "report_dir" else _config(good, chosen)
    ddp, opt = _model()
    try:
        session = scout.enable(ddp, opt, config=cfg)
    except Exception as exc:  # the point: the same error on every rank
        return {"error": type(exc).__name__, "message": str(exc)}
    session.close()
    return {"error": None, "message": ""}


def _inject(faults: list[dict[str, Any]], clock: dict[str, int]) -> None:
    """Make DCP's save raise on this rank at the steps ``faults`` name."""
    from torch.distributed.checkpoint.api import CheckpointException

    from scout_core.checkpoint import durable

    rank = dist.get_rank()
    mine = {f["step"]: f["kind"] for f in faults if f["rank"] == rank}
    if not mine:
        return
    real = durable.dcp_save  # type: ignore[attr-defined]  # the module's DCP import

    def failing(*args: Any, **kwargs: Any) -> Any:
        kind = mine.get(clock["step"])
        if kind == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if kind == "dcp":
            cause = OSError(errno.EIO, "Input/output error (injected)")
            failures: dict[int, tuple[BaseException, traceback.StackSummary]] = {
                0: (cause, traceback.StackSummary())
            }
            raise CheckpointException("injected DCP failure", failures)
        return real(*args, **kwargs)

    durable.dcp_save = failing  # type: ignore[attr-defined]  # a test seam, this rank only


def checkpoint_faults(
    report_dir: str, checkpoint_dir: str, faults: list[dict[str, Any]]
) -> dict[str, Any]:
    """Train ``STEPS`` steps while the durable store fails as ``faults`` say."""
    import scout_core as scout
    from scout_core.checkpoint import GateHandle
    from scout_core.testing import train_step

    rank = dist.get_rank()
    ddp, opt = _model()
    clock = {"step": 0}
    _inject(faults, clock)
    session = scout.enable(ddp, opt, config=_config(report_dir, checkpoint_dir))
    gate = session.checkpoints
    assert isinstance(gate, GateHandle)
    for step in range(STEPS):
        clock["step"] = step
        train_step(ddp, opt, step, rank)
    g = gate.coordinator.gate
    out = {
        "steps": session.step,
        "gate": [g.latest, g.candidate, g.verified],
        "left": sorted(p.name for p in Path(checkpoint_dir).iterdir()),
    }
    session.close()
    return out


def report_faults(report_dir: str, how: str) -> dict[str, Any]:
    """Break ``report_dir`` after ``enable`` (``how``), while replay keeps finding an SDC on
    rank 1: every verdict rank 0 writes then fails. Training must finish."""
    import scout_core as scout
    from scout_core.testing import BitFlip, Faults, train_step

    rank = dist.get_rank()
    ddp, opt = _model()
    Faults().at(rank=1, persistent=True).corrupt_output("layers.0", BitFlip(bit=0)).attach(ddp, opt)
    session = scout.enable(ddp, opt, config=_config(report_dir, None, catalog_size=None))
    assert session.replay is not None
    writer = session.replay.writer
    dist.barrier()
    if rank == 0:
        if how == "file":  # the run's directory replaced by a file: every open fails
            if writer.directory.is_dir():
                os.rmdir(writer.directory)
            writer.directory.write_text("not a directory")
        elif how == "remount-ro":
            subprocess.run(["mount", "-o", "remount,ro", report_dir], check=True, timeout=30)
        elif how == "fill":
            with open(os.path.join(report_dir, "filler"), "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
    dist.barrier()
    for step in range(STEPS):
        train_step(ddp, opt, step, rank)
    out = {
        "steps": session.step,
        "sdc": sum(1 for v in session.verdicts if v.failure and v.failure.value == "sdc"),
        "written": writer.written,
        "dropped": writer.dropped,
    }
    session.close()
    return out


def launch(report_dir: str, run_id: str | None, odd_rank_id: str | None) -> dict[str, Any]:
    """One launch with ``run_id`` (None: the default), ``odd_rank_id`` on rank 1 if given;
    K = 1 so the gate writes a candidate record at every step."""
    import scout_core as scout
    from scout_core.testing import train_step

    rank = dist.get_rank()
    ddp, opt = _model()
    chosen = odd_rank_id if odd_rank_id is not None and rank == 1 else run_id
    cfg = _config(report_dir, None, run_id=chosen)
    try:
        session = scout.enable(ddp, opt, config=cfg)
    except Exception as exc:  # the point: the same error on every rank
        return {"error": type(exc).__name__, "message": str(exc)}
    for step in range(3):
        train_step(ddp, opt, step, rank)
    out = {"error": None, "run_id": session.config.run_id}
    session.close()
    return out
