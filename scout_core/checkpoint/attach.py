"""The in-memory checkpoint gate of a live session: :class:`GateHandle`.

The gate's coordinator (:mod:`.coordinator`) over host memory (:mod:`.host_store`),
following the session's replay boundaries (:class:`~.session_gate.SessionGate`),
with the caller's own state captured alongside the model (:func:`attach_gate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Protocol

import torch
import torch.distributed as dist

from scout_core.checkpoint.catalog import GateCatalog, round_outcome
from scout_core.checkpoint.coordinator import CheckpointCoordinator
from scout_core.checkpoint.recovery import Restored
from scout_core.checkpoint.session_gate import SessionGate
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import UnsupportedSetupError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.vocabulary import Failure

__all__ = ["GateHandle", "attach_gate", "model_of", "round_outcome"]

log = logging.getLogger(__name__)

ExtraState = Callable[[], Mapping[str, Any]]
RestoreExtra = Callable[[dict[str, Any]], None]


def model_of(adapter: Any) -> torch.nn.Module | None:
    """The model whose state the gate checkpoints: the adapter's ``root``, ``module`` or
    ``model`` attribute, or None when the adapter exposes none."""
    for name in ("root", "module", "model"):
        found = getattr(adapter, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


class _GatedSession(Protocol):
    @property
    def closed(self) -> bool: ...
    @property
    def checkpoints(self) -> object: ...


class GateHandle(SessionGate):
    """The in-memory checkpoint gate attached to one session; one per rank."""

    coordinator: CheckpointCoordinator

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
        self.extra_state = extra_state
        self.restore_extra = restore_extra
        coordinator = CheckpointCoordinator(
            model,
            driver.optimizers,
            rng_streams=driver.adapter.rng_streams(),
            catalog_size=catalog.size,
            group=group,
            ranks=list(range(dist.get_world_size())),
            run_id=config.resolved_run_id(),
            writer=writer,
            checkpoint_dir=config.checkpoint_dir,
            peer_replication=config.peer_replication,
            sweep=self.sweep,
            memory=config.gate_memory,
            capture_interval=config.gate_capture_interval or config.replay_interval,
        )
        self._follow(driver, catalog, coordinator, vote)

    def set_extra_state(
        self, extra_state: ExtraState | None, restore_extra: RestoreExtra | None = None
    ) -> None:
        """Capture ``extra_state()`` (caller-owned state) with each checkpoint from now
        on; ``restore_extra`` receives it back on recovery. The same on every rank."""
        self.extra_state = extra_state
        self.restore_extra = restore_extra

    def _extra(self) -> Mapping[str, Any] | None:
        return None if self.extra_state is None else self.extra_state()

    def _live_extra(self) -> MutableMapping[str, Any] | None:
        if self.extra_state is None:
            return None
        live = self.extra_state()
        return live if isinstance(live, MutableMapping) else dict(live)

    def recover(
        self, failure: Failure | str | None, *, machines_accessible: bool = True
    ) -> Restored:
        """Select and restore the generation the gate trusts for ``failure``, bitwise; collective.
        ``extra_state()``'s mapping is updated in place and ``restore_extra`` gets the restored
        caller state. Replay resumes at the iteration after the restored step."""
        restored = self.coordinator.recover(
            None if failure is None else Failure(failure),
            step=max(self.driver.step - 1, 0),
            machines_accessible=machines_accessible,
            extra=self._live_extra(),
        )
        if self.restore_extra is not None:
            self.restore_extra(dict(restored.extra))
        self._warned = False
        # Replay's schedule follows the training iteration, which resumes after the
        # restored step; the captures armed for the abandoned iteration are useless.
        if restored.step + 1 != self.driver.step:
            self.driver.resume_at(restored.step + 1)
        return restored

    def resume(self) -> Restored | None:
        """After a restart: restore the newest verified generation of ``checkpoint_dir``, or
        return ``None``. Collective; call it once, after :meth:`set_extra_state` and before the
        first step (training and replay go on at ``step + 1``)."""
        restored = self.coordinator.resume(extra=self._live_extra())
        if restored is None:
            return None
        if self.restore_extra is not None:
            self.restore_extra(dict(restored.extra))
        self.driver.resume_at(restored.step + 1)
        return restored


def attach_gate(
    session: _GatedSession,
    *,
    extra_state: ExtraState | None = None,
    restore_extra: RestoreExtra | None = None,
) -> GateHandle:
    """The in-memory gate ``scout.enable`` attached to ``session``, with caller state.

    ``extra_state`` returns caller-owned state to capture with each checkpoint (tensors and
    JSON-safe values: step counter, data-loader position); ``restore_extra`` gets it back on
    recovery. The gate closes with the session; without one, UnsupportedSetupError.
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
