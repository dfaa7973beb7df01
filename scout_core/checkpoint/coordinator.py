"""The checkpoint coordinator: turns replay outcomes into gate decisions and checkpoints.

This is the piece the paper calls SCOUT's checkpoint coordinator. It owns one
rank's :class:`~scout_core.decision.gate.Gate`, its in-memory generations and, when a
``checkpoint_dir`` is configured, the durable store, and runs one replay boundary
end to end (:meth:`CheckpointCoordinator.on_boundary`):

1. the rank's outcome becomes :class:`~scout_core.decision.gate.LocalFlags`, combined
   job-wide with one all-reduce on the diagnostic group (errors if ranks disagree
   about the step, the recipe, the gate state or the cycle boundary);
2. the gate decides (capture / rotate / skip / retrieve);
3. the decision is carried out: capture ``latest`` in host memory; at a cycle
   boundary promote the candidate (in memory and on disk), replicate and persist
   the new candidate and drop generations nobody selects any more; on a skip drop
   the candidate everywhere; on SDC or hang select the generation recovery should
   use;
4. every change of the gate's generations is a ``scout.checkpoint/1`` evidence
   record (candidate, promote, a dropped candidate, retrieve, a skipped durable
   write), written once for the job by its lowest rank. A routine capture, which
   only moves ``latest``, writes nothing: evidence grows with what happened, not
   with the number of steps.

[Memory: full or lean]
``full`` (the default) holds up to three generations in host memory per rank
(``latest``, ``candidate``, ``verified``; :meth:`InMemoryCheckpoints.held_bytes`
reaches about 3x :meth:`~InMemoryCheckpoints.state_bytes`). ``lean`` holds at most
two: while no verified generation exists ``latest`` is captured at every accepted
boundary (it and the candidate are the two); once one exists, a routine capture
(one that would only move ``latest``) is not taken, its recipes still count toward
the cycle, and ``latest`` stays the candidate. A cycle close still captures: the
copy goes into the old verified generation's buffers before the candidate is
promoted. What lean gives up: a retrieval that selects ``latest`` (a straggler, or a
failure whose full-catalog sweep is clean) restores the last cycle close instead of
the last boundary, losing up to one catalog cycle of training; what it gains,
besides memory: routine boundaries copy nothing.

[Capture cadence]
A routine capture is also not taken when the last copy is less than
``capture_interval`` steps old (``Config.gate_capture_interval``; a session passes
``replay_interval`` unless told otherwise). With the recipes spread over their
interval (``Config.spread_recipes``) an interval holds several accepted boundaries,
one per recipe kind; copying the whole training state at each would multiply the
gate's cost by their number, for a ``latest`` a few steps fresher. So a ``latest``
retrieval restores at most ``capture_interval`` steps back, as when every recipe ran
on one boundary per interval. Every boundary's recipes still count toward the cycle,
and cycle closes always copy (the candidate is the state at the close).

Restoring is :mod:`.recovery`'s job; :meth:`CheckpointCoordinator.recover` calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.durable import DurableStore
from scout_core.checkpoint.memory import InMemoryCheckpoints
from scout_core.checkpoint.records import GateRecorder
from scout_core.checkpoint.recovery import Restored, recover
from scout_core.checkpoint.replicas import PeerReplica, replicate_to_peer
from scout_core.config.checks import GATE_MEMORY
from scout_core.decision.agreement import check_group
from scout_core.decision.gate import Action, Decision, Gate, JobFlags, Outcome, Retrieval
from scout_core.decision.gate_wire import combine, combine_outcome
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import RngStream
from scout_core.records.evidence import EvidenceWriter
from scout_core.vocabulary import Failure

__all__ = ["BoundaryResult", "CheckpointCoordinator"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BoundaryResult:
    """What one replay boundary did."""

    decision: Decision
    retrieval: Retrieval | None = None
    """Set when the boundary saw SDC or a hang: the generation recovery should use."""
    capture_s: float = 0.0
    """Host time the in-memory capture blocked for (0 when nothing was captured)."""


class CheckpointCoordinator:
    """One rank's gate, in-memory generations and durable store, driven per boundary.

    Collective: every rank of the job constructs one with the same ``catalog_size``
    and ``ranks`` and calls :meth:`on_boundary` at the same replay boundaries.
    ``group`` is a diagnostic Gloo group over ``ranks`` (the whole job).
    ``sweep`` runs the full recipe catalog now and returns this rank's outcome
    (retrieval after failures that are neither SDC nor slowness needs it).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        *,
        rng_streams: Sequence[RngStream],
        catalog_size: int,
        group: dist.ProcessGroup,
        ranks: Sequence[int],
        run_id: str,
        writer: EvidenceWriter | None = None,
        checkpoint_dir: str | None = None,
        peer_replication: bool = False,
        sweep: Callable[[], Outcome] | None = None,
        memory: str = "full",
        capture_interval: int = 1,
    ) -> None:
        self.group = check_group(group)  # a SCOUT diagnostic group, never WORLD
        self.gate = Gate(catalog_size)
        if memory not in GATE_MEMORY:
            raise ValueError(f"memory must be one of {', '.join(GATE_MEMORY)}, got {memory!r}")
        self.lean = memory == "lean"
        """At most two generations in host memory (``Config.gate_memory``; module doc)."""
        if capture_interval < 1:
            raise ValueError(f"capture_interval must be at least 1, got {capture_interval}")
        self.capture_interval = capture_interval
        """Routine captures at most once every this many steps
        (``Config.gate_capture_interval``; module doc)."""
        self.memory = InMemoryCheckpoints(model, optimizers, rng_streams)
        self.ranks = tuple(ranks)
        self.run_id = run_id
        self.writer = writer
        self.record = GateRecorder(writer, run_id=run_id, ranks=self.ranks)
        """Writes one ``scout.checkpoint/1`` record (once for the job, by its lowest rank)."""
        self.sweep = sweep
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

    def on_boundary(
        self,
        step: int,
        outcome: Outcome,
        recipes: int | Iterable[int] | None,
        *,
        extra: Mapping[str, Any] | None = None,
        machines_accessible: bool = True,
        job: JobFlags | None = None,
    ) -> BoundaryResult:
        """Algorithm 3's ``CheckpointSave`` at the replay boundary of ``step``.

        ``outcome`` is this rank's result for the boundary (all its recipe rounds and
        peer groups together, e.g. :func:`~scout_core.decision.gate.worst` of them) and
        ``recipes`` the catalog indices of the recipes checked (``None`` when this
        rank has no result). ``extra`` is the caller's state to capture with the
        model. Collective over the diagnostic group, unless ``job`` is given: the
        flags every rank already combined for this boundary (a seat of the session's
        :class:`~scout_core.decision.vote.BoundaryVote` carries them in the one
        all-reduce the boundary runs: :class:`~.catalog.GateSeat`).
        """
        gate = self.gate
        local = gate.local_flags(step, outcome, recipes)
        if job is None:
            job = combine(local, group=self.group)
        decision = gate.decide(job, local)
        detail = {
            "q": gate.q,
            "K": gate.catalog_size,
            "recipes": list(local.recipes),
            "reason": decision.reason,
        }

        if decision.action is Action.RETRIEVE:
            found = self.select(
                decision.failure, step=step, machines_accessible=machines_accessible
            )
            return BoundaryResult(decision, retrieval=found)

        if decision.action is Action.SKIP:
            gate.apply(decision)
            self.memory.drop_candidate()
            if decision.dropped is not None:
                dropped = decision.dropped
                self.discard_durable(lambda s: s == dropped, step=step)
                # Same action as the record that made it a candidate, so a reader
                # following one generation sees both; ``dropped`` tells them apart.
                self.record(
                    "candidate",
                    step,
                    decision.dropped,
                    detail={
                        **detail,
                        "q": gate.q,
                        "dropped": True,
                        "reason": f"candidate step {decision.dropped} dropped: {decision.reason}",
                    },
                )
            return BoundaryResult(decision)

        if decision.action is Action.CAPTURE and self._skip_copy(step):
            # A routine capture that is not taken: the recipes still count, and
            # ``latest`` stays the last generation copied.
            gate.apply(decision, captured=False)
            return BoundaryResult(decision)
        snap = self.memory.capture(step, extra, rotating=decision.action is Action.ROTATE)
        gate.apply(decision)
        # A routine capture only moves ``latest``: no record (a long run would write one
        # fsynced line per boundary). Cycle closes, drops and retrievals are recorded.
        if decision.action is Action.ROTATE:
            self._rotate(decision, step, detail)
        return BoundaryResult(decision, capture_s=snap.blocking_s)

    def _skip_copy(self, step: int) -> bool:
        """Whether a routine capture at ``step`` copies nothing: under a lean gate once a
        verified generation exists (it would be a third), or when the last copy is less
        than ``capture_interval`` steps old."""
        gate = self.gate
        if self.lean and gate.verified is not None:
            return True
        if self.memory.latest is None or gate.latest is None:
            return False
        return step - gate.latest < self.capture_interval

    def _rotate(self, decision: Decision, step: int, detail: Mapping[str, Any]) -> None:
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

    def job_sweep(self) -> Callable[[], Outcome] | None:
        """The caller's full-catalog sweep, its result combined job-wide (or ``None``)."""
        sweep = self.sweep
        if sweep is None:
            return None
        return lambda: combine_outcome(sweep(), group=self.group)

    def select(
        self, failure: Failure | None, *, step: int, machines_accessible: bool = True
    ) -> Retrieval:
        """Algorithm 3's ``CheckpointRetrieval`` on this gate; writes a retrieve record."""
        found = self.gate.retrieve(
            failure, machines_accessible=machines_accessible, sweep=self.job_sweep()
        )
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

    def recover(
        self,
        failure: Failure | None,
        *,
        step: int | None = None,
        machines_accessible: bool = True,
        extra: MutableMapping[str, Any] | None = None,
    ) -> Restored:
        """Select and restore the generation the gate trusts (see :func:`.recovery.recover`)."""
        return recover(
            self, failure, step=step, machines_accessible=machines_accessible, extra=extra
        )

    def close(self) -> None:
        """Detach from the optimizers (idempotent)."""
        self.memory.close()
