"""The checkpoint coordinator: the one place Algorithm 3 is carried out.

Contract: :class:`GateCoordinator` owns one rank's :class:`~scout_core.decision.gate.Gate`
and carries each boundary's decision out on a :class:`GenerationStore`. Collective: every
rank calls it at the same boundaries with the same catalog. Which store call each decision
makes: docs/internals.md, "The checkpoint gate".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist

from scout_core.checkpoint.host_store import HostMemoryStore
from scout_core.checkpoint.recovery import Restored
from scout_core.decision.agreement import check_group
from scout_core.decision.gate import (
    Action,
    Decision,
    Gate,
    JobFlags,
    LocalFlags,
    Outcome,
    Retrieval,
)
from scout_core.decision.gate_wire import combine, combine_outcome
from scout_core.integration.adapter import RngStream
from scout_core.records.evidence import EvidenceWriter
from scout_core.vocabulary import Failure

__all__ = [
    "BoundaryResult",
    "CheckpointCoordinator",
    "CheckpointGate",
    "GateCoordinator",
    "GenerationStore",
    "Recovery",
]


class Recovery(Protocol):
    """What a recovery restored: the step, ``latest`` or ``verified``, and why."""

    @property
    def step(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def reason(self) -> str: ...


R = TypeVar("R", bound=Recovery)
R_co = TypeVar("R_co", bound=Recovery, covariant=True)


class GenerationStore(Protocol[R_co]):
    """Where a gate's generations live; the coordinator calls it for each decision."""

    def capture(self, decision: Decision, extra: Mapping[str, Any] | None) -> float | None:
        """CAPTURE / ROTATE, before the gate commits: seconds blocked, or None if not taken."""
        ...

    def promote(self, decision: Decision, detail: Mapping[str, Any]) -> None:
        """ROTATE, after the gate commits: candidate → verified, latest → candidate."""
        ...

    def drop_candidate(self, decision: Decision, detail: Mapping[str, Any]) -> None:
        """SKIP, after the gate commits: the candidate can no longer be promoted."""
        ...

    def select(
        self,
        failure: Failure | None,
        *,
        step: int,
        machines_accessible: bool = True,
        sweep: Callable[[], Outcome] | None = None,
        boundary: Decision | None = None,
    ) -> Retrieval:
        """Algorithm 3's retrieval (at a RETRIEVE ``boundary``, or for a recovery when None)."""
        ...

    def restore(
        self,
        found: Retrieval,
        failure: Failure | None,
        *,
        step: int | None = None,
        extra: MutableMapping[str, Any] | None = None,
    ) -> R_co:
        """Restore the generation ``found`` selected on every rank."""
        ...

    def close(self) -> None: ...


class CheckpointGate(Protocol):
    """The checkpoint gate a session holds (``session.gate``), whichever store it uses."""

    @property
    def pending(self) -> Retrieval | None:
        """The selection an SDC or hang at a boundary made, until a restore."""
        ...

    def recover(
        self, failure: Failure | str | None, *, machines_accessible: bool = True
    ) -> Recovery:
        """Select and restore the checkpoint the gate trusts after ``failure``. Collective."""
        ...

    def resume(self) -> Recovery | None:
        """After a job restart, restore the verified generation (collective)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BoundaryResult:
    """What one replay boundary did."""

    decision: Decision
    retrieval: Retrieval | None = None
    """Set when the boundary saw SDC or a hang: the generation recovery should use."""
    capture_s: float = 0.0
    """Host time the in-memory capture blocked for (0 when nothing was captured)."""


class GateCoordinator(Generic[R]):
    """Algorithm 3 over one :class:`GenerationStore` (module doc); one per rank. ``group`` is
    a diagnostic Gloo group over the whole job; ``sweep`` runs the full catalog now and
    returns this rank's outcome (retrieval after neither SDC nor slowness needs it)."""

    def __init__(
        self,
        gate: Gate,
        store: GenerationStore[R],
        *,
        group: dist.ProcessGroup,
        sweep: Callable[[], Outcome] | None = None,
    ) -> None:
        self.group = check_group(group)  # a SCOUT diagnostic group, never WORLD
        self.gate = gate
        self.store = store
        self.sweep = sweep
        self.pending: Retrieval | None = None

    def on_boundary(
        self,
        step: int,
        outcome: Outcome,
        recipes: int | Iterable[int] | None,
        *,
        extra: Mapping[str, Any] | None = None,
        job: JobFlags | None = None,
    ) -> BoundaryResult:
        """Algorithm 3's ``CheckpointSave`` at the replay boundary of ``step``: ``recipes`` are
        the catalog indices ``outcome`` checked (``None``: no result here); ``extra`` is caller
        state to capture. Collective unless ``job`` carries the flags already combined."""
        local = self.gate.local_flags(step, outcome, recipes)
        return self.decide(combine(local, group=self.group) if job is None else job, local, extra)

    def decide(
        self, job: JobFlags, local: LocalFlags, extra: Mapping[str, Any] | None = None
    ) -> BoundaryResult:
        """Decide on the job-wide flags and carry the decision out on the store."""
        gate, store = self.gate, self.store
        d = gate.decide(job, local)
        detail = {"q": gate.q, "K": gate.catalog_size, "recipes": list(local.recipes)}
        detail["reason"] = d.reason
        if d.action is Action.RETRIEVE:
            found = store.select(d.failure, step=d.step, sweep=self.job_sweep(), boundary=d)
            self.pending = dataclasses.replace(found, failure=d.failure, found_at=d.step)
            return BoundaryResult(d, retrieval=found)
        if d.action is Action.SKIP:
            gate.apply(d)
            store.drop_candidate(d, detail)
            return BoundaryResult(d)
        blocked = store.capture(d, extra)
        gate.apply(d, captured=blocked is not None)
        if d.action is Action.ROTATE:
            store.promote(d, detail)
        return BoundaryResult(d, capture_s=blocked or 0.0)

    def job_sweep(self) -> Callable[[], Outcome] | None:
        """The caller's full-catalog sweep, its result combined job-wide (or ``None``)."""
        sweep = self.sweep
        if sweep is None:
            return None
        return lambda: combine_outcome(sweep(), group=self.group)

    def recover(
        self,
        failure: Failure | None,
        *,
        step: int | None = None,
        machines_accessible: bool = True,
        extra: MutableMapping[str, Any] | None = None,
    ) -> R:
        """Algorithm 3's ``CheckpointRetrieval``, then restore what it selects.
        Collective; ``step`` is the training step recovery happens at (for the record)."""
        at = step if step is not None else (self.gate.latest or 0)
        found = self.store.select(
            failure, step=at, machines_accessible=machines_accessible, sweep=self.job_sweep()
        )
        out = self.store.restore(found, failure, step=step, extra=extra)
        self.pending = None
        return out

    def close(self) -> None:
        """Release the store (idempotent)."""
        self.store.close()


class CheckpointCoordinator(GateCoordinator[Restored]):
    """The coordinator over host memory (:class:`~.host_store.HostMemoryStore`)."""

    store: HostMemoryStore

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
        gate = Gate(catalog_size)
        store = HostMemoryStore(
            gate,
            model,
            optimizers,
            rng_streams=rng_streams,
            group=check_group(group),
            ranks=ranks,
            run_id=run_id,
            writer=writer,
            checkpoint_dir=checkpoint_dir,
            peer_replication=peer_replication,
            memory=memory,
            capture_interval=capture_interval,
        )
        super().__init__(gate, store, group=group, sweep=sweep)
        self.ranks = store.ranks
        self.run_id = run_id
        self.writer = writer
        self.memory = store.memory
        self.durable = store.durable

    def resume(self, *, extra: MutableMapping[str, Any] | None = None) -> Restored | None:
        """After a job restart: :meth:`.host_store.HostMemoryStore.resume`. Collective."""
        return self.store.resume(extra=extra)
