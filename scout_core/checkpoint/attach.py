"""The in-memory checkpoint gate of a live replay session: :class:`GateHandle`.

The gate (:mod:`scout_core.decision.gate`) and the checkpoint coordinator
(:mod:`.coordinator`) know nothing about replay; the replay driver
(:mod:`scout_core.replay.driver`) knows nothing about checkpoints. The handle
connects them from the outside: it subscribes to the driver's boundary events and,
per :class:`~scout_core.replay.boundary.Boundary`,

1. reads this rank's outcome and the catalog slots checked off the event
   (:class:`~.catalog.GateCatalog`: the recipes due, their rounds, the worst outcome);
2. calls :meth:`~.coordinator.CheckpointCoordinator.on_boundary` with them, on every
   rank, at every boundary where a catalog recipe was due.

[After a retrieval]
An SDC at a boundary makes the gate select a generation; from then on the handle
feeds no boundary to the gate (nothing captured after the fault is trusted) until
:meth:`GateHandle.recover` restores a generation. Every rank reaches that state at
the same boundary, because the decision is job-wide.

[The full-catalog sweep]
Retrieval after a failure that is neither SDC nor slowness (a hang, a protocol
mismatch) runs every catalog recipe *now*: the driver's
:meth:`~scout_core.replay.driver.ReplayDriver.sweep`, on the last complete capture
of each layer, which the handle asks the driver to keep.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.catalog import GateCatalog, GateSeat, round_outcome
from scout_core.checkpoint.coordinator import BoundaryResult, CheckpointCoordinator
from scout_core.checkpoint.recovery import resume
from scout_core.decision.gate import Outcome, Retrieval, worst
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import UnsupportedSetupError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.replay.runner import RoundOutcome
from scout_core.vocabulary import Failure

if TYPE_CHECKING:
    from scout_core.checkpoint.recovery import Restored
    from scout_core.session import Session

__all__ = ["GateHandle", "attach_gate", "model_of", "round_outcome"]

log = logging.getLogger(__name__)

ExtraState = Callable[[], Mapping[str, Any]]
RestoreExtra = Callable[[dict[str, Any]], None]

_HISTORY = 256  # boundary results kept on the handle (a long run must not grow without bound)


def model_of(adapter: Any) -> torch.nn.Module | None:
    """The model whose state the gate checkpoints: the adapter's ``root``, ``module`` or
    ``model`` attribute, or None when the adapter exposes none."""
    for name in ("root", "module", "model"):
        found = getattr(adapter, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


class GateHandle:
    """The checkpoint gate attached to one session; one per rank."""

    def __init__(
        self,
        driver: ReplayDriver,
        catalog: GateCatalog,
        *,
        model: torch.nn.Module,
        group: dist.ProcessGroup,
        writer: EvidenceWriter | None,
        extra_state: ExtraState | None = None,
        restore_extra: RestoreExtra | None = None,
        vote: BoundaryVote[Boundary] | None = None,
    ) -> None:
        config = driver.config
        self.driver = driver
        self.extra_state = extra_state
        self.restore_extra = restore_extra
        self.catalog = catalog
        ranks = list(range(dist.get_world_size()))
        self.coordinator = CheckpointCoordinator(
            model,
            driver.optimizers,
            rng_streams=driver.adapter.rng_streams(),
            catalog_size=catalog.size,
            group=group,
            ranks=ranks,
            run_id=config.resolved_run_id(),
            writer=writer,
            checkpoint_dir=config.checkpoint_dir,
            peer_replication=config.peer_replication,
            sweep=self.sweep,
            memory=config.gate_memory,
            capture_interval=config.gate_capture_interval or config.replay_interval,
        )
        self.history: deque[BoundaryResult] = deque(maxlen=_HISTORY)
        """The most recent boundary results, oldest first."""
        self.pending: Retrieval | None = None
        """The selection an SDC at a boundary made; set until :meth:`recover` runs."""
        self.sweep_rounds: list[RoundOutcome] = []
        """The rounds of the most recent full-catalog sweep."""
        self.on_sdc: Callable[[int], None] | None = None
        """Called with the boundary's step when an SDC there made the gate select
        (``Config.on_sdc = "terminate"`` sets it: the session ends the job)."""
        self._warned = False
        self._closed = False
        self._seat = GateSeat(vote, catalog, lambda: self.coordinator.gate, self._holding, group)
        driver.keep_captures(True)
        self._unsubscribe = driver.on_boundary(self._on_boundary)
        if driver.peer_size < 2:
            log.warning("replay has no peers here; the checkpoint gate never certifies")

    def set_extra_state(
        self, extra_state: ExtraState | None, restore_extra: RestoreExtra | None = None
    ) -> None:
        """Capture ``extra_state()`` (caller-owned state) with each checkpoint from now
        on; ``restore_extra`` receives it back on recovery. The same on every rank."""
        self.extra_state = extra_state
        self.restore_extra = restore_extra

    # -- the boundary --------------------------------------------------------------------

    def _holding(self) -> bool:
        return self.pending is not None

    def _on_boundary(self, boundary: Boundary) -> None:
        voted = self._seat.job(boundary)  # None without a vote: the coordinator combines
        found = self.catalog.evaluate(boundary)
        if found is None:
            return
        if self.pending is not None:
            if not self._warned:
                log.warning(
                    "the gate selected %s step %s; nothing is captured until recover()",
                    self.pending.selected.value,
                    self.pending.step,
                )
                self._warned = True
            return
        outcome, slots = found
        step = boundary.step
        extra = None if self.extra_state is None else self.extra_state()
        result = self.coordinator.on_boundary(step, outcome, slots, extra=extra, job=voted)
        self.history.append(result)
        if result.retrieval is not None:
            self.pending = result.retrieval
            self._warned = False
            log.warning(
                "%s at step %d; the gate selects %s step %s (%s)",
                result.decision.failure.value if result.decision.failure else "failure",
                step,
                result.retrieval.selected.value,
                result.retrieval.step,
                result.retrieval.reason,
            )
            if self.on_sdc is not None and result.decision.failure is Failure.SDC:
                self.on_sdc(step)

    # -- the full-catalog sweep ----------------------------------------------------------

    def sweep(self) -> Outcome:
        """Run every catalog recipe now and return this rank's outcome. Collective over
        the job (every rank runs the same recipes in the same order)."""
        if self.driver.peer_size < 2:
            return Outcome.MISSING
        self.sweep_rounds = self.driver.sweep(self.catalog.recipes)
        return worst(round_outcome(r) for r in self.sweep_rounds)

    # -- recovery ------------------------------------------------------------------------

    def recover(self, failure: Failure | None, *, machines_accessible: bool = True) -> Restored:
        """Select and restore the generation the gate trusts for ``failure``. Collective.

        Model, optimizer, RNG streams and the caller state are restored bitwise;
        ``extra_state()``'s mapping is updated in place (its tensors copied into)
        and ``restore_extra`` receives the restored caller state. Replay resumes at
        the iteration after the restored step (``session.step``).
        """
        target: MutableMapping[str, Any] | None = None
        if self.extra_state is not None:
            live = self.extra_state()
            target = live if isinstance(live, MutableMapping) else dict(live)
        at = max(self.driver.step - 1, 0)
        restored = self.coordinator.recover(
            failure, step=at, machines_accessible=machines_accessible, extra=target
        )
        if self.restore_extra is not None:
            self.restore_extra(dict(restored.extra))
        self.pending = None
        self._warned = False
        # Replay's schedule follows the training iteration, which resumes after the
        # restored step; the captures armed for the abandoned iteration are useless.
        resume = restored.step + 1
        if resume != self.driver.step:
            self.driver.resume_at(resume)
        return restored

    def resume(self) -> Restored | None:
        """After a restart: restore the newest verified generation of ``checkpoint_dir``
        (:func:`~scout_core.checkpoint.recovery.resume`). Collective; call it once at
        start, after :meth:`set_extra_state` and before the first training step.

        Returns what was restored (training continues at ``step + 1``, and so does
        replay's clock) or ``None`` on a first start, when there is nothing to resume.
        """
        target: MutableMapping[str, Any] | None = None
        if self.extra_state is not None:
            live = self.extra_state()
            target = live if isinstance(live, MutableMapping) else dict(live)
        restored = resume(self.coordinator, extra=target)
        if restored is None:
            return None
        if self.restore_extra is not None:
            self.restore_extra(dict(restored.extra))
        self.driver.resume_at(restored.step + 1)
        return restored

    def close(self) -> None:
        """Unsubscribe from the driver, stop keeping captures, detach the coordinator."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        self.driver.keep_captures(False)
        self.coordinator.close()


def attach_gate(
    session: Session,
    *,
    extra_state: ExtraState | None = None,
    restore_extra: RestoreExtra | None = None,
) -> GateHandle:
    """The in-memory gate ``scout.enable`` attached to ``session``, with caller state.

    ``extra_state`` returns the caller-owned state to capture with each checkpoint
    (a dict of tensors and JSON-safe values: step counter, data-loader position);
    ``restore_extra`` receives it back on recovery. The gate is configured by the
    session's ``Config`` (``gate``, ``checkpoint_dir``, ``catalog_size``,
    ``peer_replication``) and closed with the session. Raises
    :class:`~scout_core.errors.UnsupportedSetupError` when the session has none.
    """
    handle = session.checkpoints
    if session.closed or not isinstance(handle, GateHandle):
        raise UnsupportedSetupError(
            "attach_gate needs an open SCOUT session with the in-memory checkpoint gate "
            "(Config.gate on, replay running, a plain-PyTorch model)"
        )
    if extra_state is not None or restore_extra is not None:
        handle.set_extra_state(extra_state, restore_extra)
    return handle
