"""Recovery: restore the generation the gate trusts, from memory, a peer or disk.

:func:`recover` is what ``session.recover(failure)`` delegates to. It asks the gate
which generation the failure allows (Algorithm 3's ``CheckpointRetrieval``: SDC or
an unreachable machine → verified, a straggler → latest, anything else → the
full-catalog sweep decides), then restores it from the cheapest place every rank
can serve it from:

1. host memory, when every rank holds that generation (checked with a collective
   minimum/maximum of the step each rank holds, *before* anything is applied);
2. else, with peer replication on, a rank that lost its copy fetches it back from
   the peer that holds its replica, and the check is repeated;
3. else the durable store (:mod:`.durable`), which runs the same rank-consistency
   check over its generations.

It returns what it restored (:class:`Restored`: step, role, source, reason) and
writes a ``scout.checkpoint/1`` retrieve record. :func:`restore_from_disk` is the
same restore for a *fresh* set of processes, from the checkpoint directory alone.
:func:`resume` is the recovery hand-off after a job restart: a fresh job whose gate
is attached restores the newest verified generation of its ``checkpoint_dir`` into
the live session (gate state included), or does nothing on a first start.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.durable import DurableStore, scan
from scout_core.checkpoint.records import write_gate_record
from scout_core.checkpoint.replicas import fetch_from_peer
from scout_core.checkpoint.state import check_tree, restore_tree
from scout_core.checkpoint.storage import STORAGE_ERRORS, describe
from scout_core.decision.agreement import all_ok, min_max
from scout_core.decision.gate import Selection
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import FrameworkAdapter, RngStream
from scout_core.integration.adapter_base import default_rng_streams
from scout_core.records.evidence import EvidenceWriter
from scout_core.topology.groups import diagnostic_group
from scout_core.vocabulary import Failure

if TYPE_CHECKING:
    from scout_core.checkpoint.coordinator import CheckpointCoordinator

log = logging.getLogger(__name__)

__all__ = [
    "Restored",
    "recover",
    "restore_agreed",
    "restore_from_disk",
    "resume",
    "default_rng_streams",
]


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
    """Why this generation (the retrieval's reason)."""
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
    """Apply ``tree`` only once every rank of ``group`` has checked that it can apply
    its own (:func:`~.state.check_tree`); else :class:`CheckpointError` on every rank and
    nothing is applied anywhere. Collective."""
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


def recover(
    coord: CheckpointCoordinator,
    failure: Failure | None,
    *,
    step: int | None = None,
    machines_accessible: bool = True,
    extra: MutableMapping[str, Any] | None = None,
) -> Restored:
    """Select the generation ``failure`` allows and restore it on every rank. Collective.

    ``step`` is the training step recovery happens at (for the record; default: the
    gate's latest). ``extra`` is the caller's live state, updated in place. Raises
    :class:`CheckpointError` when no generation can be selected or restored.
    """
    at = step if step is not None else (coord.gate.latest or 0)
    found = coord.gate.retrieve(
        failure, machines_accessible=machines_accessible, sweep=coord.job_sweep()
    )
    detail: dict[str, Any] = {
        "reason": found.reason,
        "phase": "restore",
        "sweep": None if found.sweep is None else found.sweep.value,
    }
    if found.step is None:
        coord.record(
            "retrieve",
            at,
            None,
            selected=found.selected,
            failure=failure,
            detail={**detail, "restored": False},
        )
        raise CheckpointError(
            f"no {found.selected.value} checkpoint exists yet to recover from ({found.reason})"
        )
    target = found.step
    memory = coord.memory
    memory.settle()  # a copy still in flight must not read what the restore writes
    snap = memory.get(found.selected)
    held = snap if snap is not None and snap.step == target else None
    lo, hi = min_max(-1 if held is None else target, coord.group)
    source = "memory"
    tree: Any = None
    if lo != hi and hi == target and coord.peer_replication:
        # Some rank lost its copy: the peers that hold replicas send them back.
        try:
            mine = fetch_from_peer(coord.replicas.get(target), group=coord.group, ranks=coord.ranks)
        except CheckpointError as exc:  # a malformed replica: this rank falls back to disk
            log.warning("the replica a peer sent back is unusable: %s", exc)
            mine = None
        if held is None and mine is not None and mine.step == target:
            tree, source = mine.tree, "peer"
        lo, hi = min_max(-1 if (held is None and tree is None) else target, coord.group)
    if lo == hi == target:
        if held is not None:
            held.wait()
            tree = held.tree
    else:
        if coord.durable is None:
            raise CheckpointError(
                f"step {target} ({found.selected.value}) is not in every rank's memory "
                "and no checkpoint_dir is configured"
            )
        role = "verified" if found.selected is Selection.VERIFIED else None
        gen, tree = coord.durable.load(role)
        if gen.step != target:
            raise CheckpointError(
                f"the gate selected step {target} but the newest {role or 'durable'} "
                f"generation on disk is step {gen.step}"
            )
        source = "disk"
    restored_extra = restore_agreed(
        tree,
        memory.model,
        memory.optimizers,
        memory.rng_streams,
        extra,
        group=coord.group,
        what=f"step {target} ({source})",
    )
    coord.gate.after_restore(found.selected, target)
    if found.selected is Selection.VERIFIED:
        # Everything newer than verified is untrusted: drop it in memory and on disk.
        memory.latest = (
            memory.verified
            if memory.verified is not None and memory.verified.step == target
            else None
        )
        memory.candidate = None
        if coord.durable is not None:
            coord.discard_durable(lambda s: s != target, step=at)
    coord.record(
        "retrieve",
        at,
        target,
        selected=found.selected,
        failure=failure,
        detail={**detail, "restored": True, "source": source},
    )
    return Restored(target, found.selected.value, source, found.reason, restored_extra)


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

    Picks the newest ``role`` generation (``"verified"`` by default; ``None`` takes
    the newest of any role, i.e. trusts the latest), checks every rank holds it,
    verifies this rank's shard and restores model, optimizer(s), RNG streams (the
    adapter's, else CPU and CUDA) and ``extra`` in place. ``group`` defaults to a
    new Gloo group over the whole job. With ``report_dir`` (and ``run_id``) a
    retrieve record is written.
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


def resume(
    coord: CheckpointCoordinator, *, extra: MutableMapping[str, Any] | None = None
) -> Restored | None:
    """The recovery hand-off: restore the newest *verified* generation of the durable
    store into a freshly started job's live gate. Collective over the job.

    A restarted job (``torchrun --max-restarts``, a scheduler's requeue) has lost its
    in-memory generations; what the gate certified before the failure is the verified
    generation on disk. This restores it bitwise (model, optimizer(s), RNG streams,
    ``extra`` in place), makes it the gate's ``latest`` and ``verified`` (the cycle
    restarts), discards every newer generation on disk (the candidate the failed run
    left was never certified) and writes a ``retrieve`` record naming the run it came
    from. Returns ``None``, and changes nothing, when no rank holds a verified
    generation (a first start). Raises :class:`CheckpointError` on every rank when the
    ranks hold different generations, or a shard is damaged, before anything is applied.
    """
    durable = coord.durable
    if durable is None:
        raise CheckpointError("resuming after a restart needs Config.checkpoint_dir")
    try:
        verified = [g.step for g in scan(durable.root) if g.role == "verified"]
        mine = verified[-1] if verified else -1
    except STORAGE_ERRORS:  # a damaged directory: load() below names it on every rank
        mine = -2
    lo, hi = min_max(mine, coord.group)
    if lo == hi == -1:
        return None
    gen, tree = durable.load("verified")
    restored_extra = restore_agreed(
        tree,
        coord.memory.model,
        coord.memory.optimizers,
        coord.memory.rng_streams,
        extra,
        group=coord.group,
        what=f"step {gen.step} (disk, resumed)",
    )
    coord.gate.resumed(gen.step)
    coord.discard_durable(lambda s: s != gen.step, step=gen.step)
    reason = f"resumed after a restart from verified step {gen.step} of run {gen.run_id!r}"
    coord.record(
        "retrieve",
        gen.step,
        gen.step,
        selected=Selection.VERIFIED,
        failure=None,
        detail={
            "reason": reason,
            "phase": "resume",
            "restored": True,
            "source": "disk",
            "from_run": gen.run_id,
        },
    )
    return Restored(gen.step, Selection.VERIFIED.value, "disk", reason, restored_extra)
