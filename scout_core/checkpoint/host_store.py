"""The host-memory generation store: the gate's generations in host memory, peer
replicas and, with a ``checkpoint_dir``, the durable DCP store.

One of the two :class:`~.coordinator.GenerationStore` implementations (the other is
:mod:`.framework_gate`). It carries each gate decision out on the copies it holds and
writes the ``scout.checkpoint/1`` records; a routine capture writes nothing. A restore
takes the cheapest place every rank can serve the generation from: memory, a peer, disk.
Memory modes and capture cadence: docs/checkpoint_gate.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.durable import DurableStore
from scout_core.checkpoint.generations import scan
from scout_core.checkpoint.memory import InMemoryCheckpoints
from scout_core.checkpoint.recorder import GateRecorder
from scout_core.checkpoint.recovery import Restored, restore_agreed
from scout_core.checkpoint.replicas import PeerReplica, fetch_from_peer, replicate_to_peer
from scout_core.checkpoint.storage import STORAGE_ERRORS
from scout_core.config.checks import GATE_MEMORY
from scout_core.decision.agreement import min_max
from scout_core.decision.gate import Action, Decision, Gate, Outcome, Retrieval, Selection
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import RngStream
from scout_core.records.evidence import EvidenceWriter
from scout_core.vocabulary import Failure

__all__ = ["HostMemoryStore"]

log = logging.getLogger(__name__)


class HostMemoryStore:
    """One rank's in-memory generations, replicas and durable store (module doc)."""

    def __init__(
        self,
        gate: Gate,
        model: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        *,
        rng_streams: Sequence[RngStream],
        group: dist.ProcessGroup,
        ranks: Sequence[int],
        run_id: str,
        writer: EvidenceWriter | None = None,
        checkpoint_dir: str | None = None,
        peer_replication: bool = False,
        memory: str = "full",
        capture_interval: int = 1,
    ) -> None:
        if memory not in GATE_MEMORY:
            raise ValueError(f"memory must be one of {', '.join(GATE_MEMORY)}, got {memory!r}")
        if capture_interval < 1:
            raise ValueError(f"capture_interval must be at least 1, got {capture_interval}")
        self.gate = gate
        self.group = group
        self.lean = memory == "lean"
        """At most two generations in host memory (``Config.gate_memory``)."""
        self.capture_interval = capture_interval
        """Routine captures at most every this many steps (``Config.gate_capture_interval``)."""
        self.memory = InMemoryCheckpoints(model, optimizers, rng_streams)
        self.ranks = tuple(ranks)
        self.record = GateRecorder(writer, run_id=run_id, ranks=self.ranks)
        """Writes one ``scout.checkpoint/1`` record (once for the job, by its lowest rank)."""
        self.peer_replication = peer_replication and len(self.ranks) > 1
        self.replicas: dict[int, PeerReplica] = {}
        """Peer replicas this rank holds, by step (the candidate and the verified)."""
        self._unpersisted: set[int] = set()
        """Generations the gate holds whose durable write every rank agreed failed."""
        self.durable = (
            None
            if checkpoint_dir is None
            else DurableStore(checkpoint_dir, group=group, ranks=list(self.ranks), run_id=run_id)
        )

    # -- the boundary --------------------------------------------------------------------

    def capture(self, decision: Decision, extra: Mapping[str, Any] | None) -> float | None:
        """Copy the live state for a CAPTURE or ROTATE; seconds blocked, or None if skipped."""
        rotating = decision.action is Action.ROTATE
        if not rotating and self._skip_copy(decision.step):
            return None
        return self.memory.capture(decision.step, extra, rotating=rotating).blocking_s

    def _skip_copy(self, step: int) -> bool:
        gate = self.gate
        if self.lean and gate.verified is not None:
            return True
        if self.memory.latest is None or gate.latest is None:
            return False
        return step - gate.latest < self.capture_interval

    def promote(self, decision: Decision, detail: Mapping[str, Any]) -> None:
        """A clean cycle closed: the candidate becomes verified (memory and disk), the
        fresh capture the candidate (replicated, persisted), stale copies go."""
        step = decision.step
        self.memory.rotate()
        candidate = self.memory.candidate
        assert candidate is not None  # rotate() just made latest the candidate
        if decision.promote is not None:
            promoted = {**detail}
            if decision.promote in self._unpersisted:  # its durable write was skipped
                promoted.update(durable=False, reason=f"{detail['reason']} (in memory only)")
            elif self.durable is not None:
                try:
                    self.durable.set_role(decision.promote, "verified")
                except CheckpointError as exc:  # agreed on every rank: skip, go on
                    promoted.update(self._storage_skip(exc, f"marking step {decision.promote}"))
            self.record("promote", step, decision.promote, detail=promoted)
        if self.peer_replication:
            got = replicate_to_peer(candidate, group=self.group, ranks=self.ranks)
            self.replicas[got.step] = got
        made = {**detail}
        if self.durable is not None:
            candidate.wait()
            try:
                self.durable.persist(step, candidate.tree, role="candidate")
            except CheckpointError as exc:  # agreed on every rank: skip this capture
                made.update(self._storage_skip(exc, f"persisting candidate step {step}"))
                self._unpersisted.add(step)
            verified = self.gate.verified
            self.discard_durable(lambda s: s not in {step, verified}, step=step)
        live = {step, self.gate.verified}
        self.replicas = {k: v for k, v in self.replicas.items() if k in live}
        self._unpersisted &= live
        self.record("candidate", step, step, detail=made)

    def drop_candidate(self, decision: Decision, detail: Mapping[str, Any]) -> None:
        """A boundary that was not clean: the candidate can no longer be promoted."""
        self.memory.drop_candidate()
        if decision.dropped is None:
            return
        dropped = decision.dropped
        self.discard_durable(lambda s: s == dropped, step=decision.step)
        # Same action as the candidate record, so a reader following one generation sees both.
        why = f"candidate step {dropped} dropped: {decision.reason}"
        self.record(
            "candidate",
            decision.step,
            dropped,
            detail={**detail, "q": self.gate.q, "dropped": True, "reason": why},
        )

    def _storage_skip(self, exc: CheckpointError, what: str) -> dict[str, Any]:
        """The record fields and log line of a durable write every rank agreed failed."""
        log.warning(
            "%s failed on some rank (%s); the durable copy is skipped, the gate and training go on",
            what,
            exc,
        )
        return {"durable": False, "skipped": True, "storage_error": f"{what}: {exc}"}

    def discard_durable(self, drop: Callable[[int], bool], *, step: int) -> None:
        """Remove the durable generations ``drop`` selects; a failure (agreed on every
        rank) is logged and recorded, never raised: stale generations only cost disk."""
        if self.durable is None:
            return
        try:
            self.durable.discard_where(drop)
        except CheckpointError as exc:
            detail = self._storage_skip(exc, "removing old generations")
            self.record("capture", step, step, detail={**detail, "reason": str(exc)})

    # -- retrieval -----------------------------------------------------------------------

    def select(
        self,
        failure: Failure | None,
        *,
        step: int,
        machines_accessible: bool = True,
        sweep: Callable[[], Outcome] | None = None,
        boundary: Decision | None = None,
    ) -> Retrieval:
        """Algorithm 3's ``CheckpointRetrieval``; at a ``boundary`` it writes a retrieve record."""
        found = self.gate.retrieve(failure, machines_accessible=machines_accessible, sweep=sweep)
        if boundary is not None:
            self.record(
                "retrieve",
                step,
                found.step,
                selected=found.selected,
                failure=failure,
                detail={
                    "reason": found.reason,
                    "phase": "select",
                    "sweep": None if found.sweep is None else found.sweep.value,
                },
            )
        return found

    def restore(
        self,
        found: Retrieval,
        failure: Failure | None,
        *,
        step: int | None = None,
        extra: MutableMapping[str, Any] | None = None,
    ) -> Restored:
        """Restore the selected generation on every rank from memory, else a peer replica,
        else disk. Collective; ``extra`` (the caller's live state) is updated in place."""
        at = step if step is not None else (self.gate.latest or 0)
        detail: dict[str, Any] = {
            "reason": found.reason,
            "phase": "restore",
            "sweep": None if found.sweep is None else found.sweep.value,
        }
        if found.step is None:
            self.record(
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
        tree, source = self._fetch(found.selected, target)
        restored_extra = self._restore(tree, extra, f"step {target} ({source})")
        self.gate.after_restore(found.selected, target)
        if found.selected is Selection.VERIFIED:
            # Everything newer than verified is untrusted: drop it in memory and on disk.
            memory = self.memory
            v = memory.verified
            memory.latest = v if v is not None and v.step == target else None
            memory.candidate = None
            self.discard_durable(lambda s: s != target, step=at)
        self.record(
            "retrieve",
            at,
            target,
            selected=found.selected,
            failure=failure,
            detail={**detail, "restored": True, "source": source},
        )
        return Restored(target, found.selected.value, source, found.reason, restored_extra)

    def _restore(
        self, tree: Any, extra: MutableMapping[str, Any] | None, what: str
    ) -> dict[str, Any]:
        """Apply ``tree`` to the model, optimizers and RNG streams (agreed on every rank)."""
        m = self.memory
        return restore_agreed(
            tree, m.model, m.optimizers, m.rng_streams, extra, group=self.group, what=what
        )

    def _fetch(self, selected: Selection, target: int) -> tuple[Any, str]:
        """The tree of generation ``target`` on this rank and where it came from; every
        rank takes it from the same kind of place (agreed before anything is applied)."""
        memory = self.memory
        memory.settle()  # a copy still in flight must not read what the restore writes
        snap = memory.get(selected)
        held = snap if snap is not None and snap.step == target else None
        lo, hi = min_max(-1 if held is None else target, self.group)
        tree: Any = None
        source = "memory"
        if lo != hi and hi == target and self.peer_replication:
            # Some rank lost its copy: the peers that hold replicas send them back.
            try:
                mine = fetch_from_peer(
                    self.replicas.get(target), group=self.group, ranks=self.ranks
                )
            except CheckpointError as exc:  # a malformed replica: this rank falls back to disk
                log.warning("the replica a peer sent back is unusable: %s", exc)
                mine = None
            if held is None and mine is not None and mine.step == target:
                tree, source = mine.tree, "peer"
            lo, hi = min_max(-1 if (held is None and tree is None) else target, self.group)
        if lo == hi == target:
            if held is not None:
                held.wait()
                tree = held.tree
            return tree, source
        if self.durable is None:
            raise CheckpointError(
                f"step {target} ({selected.value}) is not in every rank's memory "
                "and no checkpoint_dir is configured"
            )
        role = "verified" if selected is Selection.VERIFIED else None
        gen, tree = self.durable.load(role)
        if gen.step != target:
            raise CheckpointError(
                f"the gate selected step {target} but the newest {role or 'durable'} "
                f"generation on disk is step {gen.step}"
            )
        return tree, "disk"

    def resume(self, *, extra: MutableMapping[str, Any] | None = None) -> Restored | None:
        """After a job restart: restore the newest *verified* generation on disk (newer ones
        are discarded); None on a first start. Collective: if ranks disagree or a shard is
        damaged, every rank raises before anything is applied."""
        durable = self.durable
        if durable is None:
            raise CheckpointError("resuming after a restart needs Config.checkpoint_dir")
        try:
            verified = [g.step for g in scan(durable.root) if g.role == "verified"]
            mine = verified[-1] if verified else -1
        except STORAGE_ERRORS:  # a damaged directory: load() below names it on every rank
            mine = -2
        lo, hi = min_max(mine, self.group)
        if lo == hi == -1:
            return None
        gen, tree = durable.load("verified")
        restored_extra = self._restore(tree, extra, f"step {gen.step} (disk, resumed)")
        self.gate.resumed(gen.step)
        self.discard_durable(lambda s: s != gen.step, step=gen.step)
        reason = f"resumed after a restart from verified step {gen.step} of run {gen.run_id!r}"
        self.record(
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

    def close(self) -> None:
        """Detach from the optimizers (idempotent)."""
        self.memory.close()
