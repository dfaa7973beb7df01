"""Restoring a generation's tree into the live training state, agreed first.

:func:`restore_agreed` applies a tree only once every rank has checked it can apply its
own; :func:`restore_from_disk` restores a *fresh* set of processes from the checkpoint
directory alone. Selecting what to restore is :mod:`.coordinator`'s job; restoring a live
gate's generation is :mod:`.host_store`'s.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.durable import DurableStore
from scout_core.checkpoint.recorder import write_gate_record
from scout_core.checkpoint.state import check_tree, restore_tree
from scout_core.checkpoint.storage import STORAGE_ERRORS, describe
from scout_core.decision.agreement import all_ok
from scout_core.decision.gate import Selection
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import FrameworkAdapter, RngStream
from scout_core.integration.adapter_base import default_rng_streams
from scout_core.records.evidence import EvidenceWriter
from scout_core.topology.groups import diagnostic_group

log = logging.getLogger(__name__)

__all__ = ["Restored", "restore_agreed", "restore_from_disk", "default_rng_streams"]


@dataclass(frozen=True)
class Restored:
    """What a recovery restored."""

    step: int
    """Optimizer step of the restored generation."""
    role: str
    """``latest`` or ``verified``: what the retrieval selected."""
    source: str
    """``memory``, ``peer`` or ``disk``."""
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)
    """The caller state saved with the generation."""


def restore_agreed(
    tree: Any,
    model: torch.nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    rng_streams: Sequence[RngStream],
    extra: MutableMapping[str, Any] | None,
    *,
    group: dist.ProcessGroup,
    what: str,
) -> dict[str, Any]:
    """Apply ``tree`` only once every rank of ``group`` has checked it can apply its own;
    else :class:`CheckpointError` on every rank and nothing is applied. Collective."""
    error: BaseException | None = None
    try:
        check_tree(tree, model, optimizers, rng_streams)
    except STORAGE_ERRORS as exc:
        error = exc
    if not all_ok(error is None, group):
        mine = f" (this rank: {describe(error)})" if error is not None else ""
        raise CheckpointError(
            f"{what} does not fit the live training state on some rank{mine}; nothing was "
            "restored on any rank"
        ) from error
    return restore_tree(tree, model, optimizers, rng_streams, extra)


def restore_from_disk(
    checkpoint_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    *,
    extra: MutableMapping[str, Any] | None = None,
    adapter: FrameworkAdapter | None = None,
    rng_streams: Sequence[RngStream] | None = None,
    role: str | None = "verified",
    group: dist.ProcessGroup | None = None,
    run_id: str | None = None,
    report_dir: str | None = None,
) -> Restored:
    """Restore a fresh process from ``checkpoint_dir`` alone. Collective over the job.

    Picks the newest ``role`` generation (``None``: any), checks every rank holds it, verifies
    this rank's shard and restores model, optimizers, RNG streams (the adapter's, else CPU
    and CUDA) and ``extra`` in place; ``report_dir`` gets a retrieve record.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise CheckpointError("restore_from_disk needs torch.distributed to be initialised")
    if group is None:
        group = diagnostic_group()
    optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
    if rng_streams is None:
        rng_streams = list(adapter.rng_streams() if adapter is not None else default_rng_streams())
    ranks = list(range(dist.get_world_size()))
    store = DurableStore(checkpoint_dir, group=group, ranks=ranks, run_id=run_id or "scout")
    gen, tree = store.load(role, run_id=run_id)
    restored_extra = restore_agreed(
        tree, model, optimizers, rng_streams, extra, group=group, what=f"step {gen.step}"
    )
    selected = Selection.VERIFIED if gen.role == "verified" else Selection.LATEST
    reason = f"fresh restore of the newest {role or 'durable'} generation"
    if report_dir is not None:
        with EvidenceWriter(report_dir, dist.get_rank(), run_id=gen.run_id) as writer:
            write_gate_record(
                writer,
                run_id=gen.run_id,
                ranks=ranks,
                action="retrieve",
                step=gen.step,
                checkpoint_step=gen.step,
                selected=selected,
                detail={"reason": reason, "source": "disk", "role": gen.role},
            )
    return Restored(gen.step, selected.value, "disk", reason, restored_extra)
