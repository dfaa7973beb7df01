"""What both checkpoint gates of a session share: :class:`SessionGate`.

A session's gate (:class:`~.attach.GateHandle` or :class:`~.framework_gate.FrameworkGate`)
follows the replay driver's boundaries, agrees job-wide through a
:class:`~.catalog.GateAgreement` and hands each agreed boundary to its coordinator. After
an SDC or a hang selects a generation, it decides nothing more, on every rank, until a
restore.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from scout_core.checkpoint.catalog import GateAgreement, GateCatalog, round_outcome
from scout_core.checkpoint.coordinator import BoundaryResult, GateCoordinator
from scout_core.decision.gate import Outcome, Retrieval, worst
from scout_core.decision.vote import BoundaryVote
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.replay.runner import RoundOutcome
from scout_core.vocabulary import Failure

__all__ = ["SessionGate"]

log = logging.getLogger(__name__)

_HISTORY = 256  # boundary results kept (a long run must not grow without bound)


class SessionGate:
    """The boundary side of a session's checkpoint gate (module doc); one per rank."""

    coordinator: GateCoordinator[Any]

    def _follow(
        self,
        driver: ReplayDriver,
        catalog: GateCatalog,
        coordinator: GateCoordinator[Any],
        vote: BoundaryVote[Boundary] | None,
    ) -> None:
        """Subscribe to ``driver``'s boundaries (once, from the subclass's constructor)."""
        self.driver = driver
        self.catalog = catalog
        self.coordinator = coordinator
        self.history: deque[BoundaryResult] = deque(maxlen=_HISTORY)
        """The most recent boundary results, oldest first."""
        self.sweep_rounds: list[RoundOutcome] = []
        """The rounds of the most recent full-catalog sweep."""
        self.on_sdc: Callable[[int], None] | None = None
        """Called with the boundary's step when an SDC there made the gate select."""
        self._warned = False
        self._closed = False
        self._agreement = GateAgreement(
            vote, catalog, lambda: coordinator.gate, self._holding, coordinator.group
        )
        driver.keep_captures(True)
        self._unsubscribe = driver.on_boundary(self._on_boundary)
        if driver.peer_size < 2:
            log.warning("replay has no peers here; the checkpoint gate never certifies")

    @property
    def pending(self) -> Retrieval | None:
        """The selection an SDC or a hang at a boundary made, until a restore."""
        return self.coordinator.pending

    def _holding(self) -> bool:
        return self.coordinator.pending is not None

    def _extra(self) -> Mapping[str, Any] | None:
        """Caller state captured with a generation (none by default)."""
        return None

    def _selected(self, result: BoundaryResult) -> None:
        """A boundary made the gate select (``result.retrieval``); log it."""
        found = result.retrieval
        assert found is not None
        log.warning(
            "%s at step %d; the gate selects %s step %s (%s)",
            found.failure.value if found.failure else "failure",
            result.decision.step,
            found.selected.value,
            found.step,
            found.reason,
        )

    def _on_boundary(self, boundary: Boundary) -> None:
        agreed = self._agreement.agree(boundary)  # None after a selection, until a restore
        if agreed is None:
            pending = self.pending
            if pending is not None and boundary.due and not self._warned:
                log.warning(
                    "the gate selected %s step %s; nothing is captured until a restore",
                    pending.selected.value,
                    pending.step,
                )
                self._warned = True
            return
        result = self.coordinator.decide(*agreed, self._extra())
        self.history.append(result)
        if result.retrieval is None:
            return
        self._warned = False
        self._selected(result)
        if self.on_sdc is not None and result.decision.failure is Failure.SDC:
            self.on_sdc(boundary.step)

    def sweep(self) -> Outcome:
        """Run every catalog recipe now, in the same order on every rank; this rank's outcome."""
        if self.driver.peer_size < 2:
            return Outcome.MISSING
        self.sweep_rounds = self.driver.sweep(self.catalog.recipes)
        return worst(round_outcome(r) for r in self.sweep_rounds)

    def close(self) -> None:
        """Unsubscribe from the driver, stop keeping captures, release the store."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        self.driver.keep_captures(False)
        self.coordinator.close()
