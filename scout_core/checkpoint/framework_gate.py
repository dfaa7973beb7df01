"""Gating a framework's own checkpoints with the replay evidence: :class:`FrameworkGate`.

A plugin gives a :class:`~scout_core.checkpoint.io.CheckpointIO` and routes the framework's
save and load through :meth:`FrameworkGate.save` and :meth:`FrameworkGate.load`. Contract:
a save is refused while an SDC awaits recovery; a load without a tag picks the newest
verified tag, agreed job-wide before the framework reads anything, and resets the gate's
cycle and step clock. Every rank calls these at the same point. Docs:
docs/checkpoint_gate.md, "Checkpoints the framework owns".
"""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from scout_core.checkpoint.catalog import GateCatalog
from scout_core.checkpoint.certification import (
    Ledger,
    TagEntry,
)
from scout_core.checkpoint.coordinator import GateCoordinator
from scout_core.checkpoint.framework_store import FrameworkStore
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.checkpoint.recorder import GateRecorder
from scout_core.checkpoint.session_gate import SessionGate
from scout_core.checkpoint.storage import STORAGE_ERRORS, describe
from scout_core.decision.agreement import all_ok
from scout_core.decision.gate import (
    Gate,
    Selection,
)
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import CheckpointError, UnsupportedSetupError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.vocabulary import Failure

__all__ = ["FrameworkGate"]

log = logging.getLogger(__name__)


class FrameworkGate(SessionGate):
    """The checkpoint gate of one framework's own checkpoints; one per rank (module doc)."""

    coordinator: GateCoordinator[Recovered]

    def __init__(
        self,
        driver: ReplayDriver,
        catalog: GateCatalog,
        *,
        group: dist.ProcessGroup,
        writer: EvidenceWriter | None,
        vote: BoundaryVote[Boundary] | None = None,
    ) -> None:
        self.writer = writer
        self.ranks = tuple(range(dist.get_world_size()))
        self.run_id = driver.config.resolved_run_id()
        gate = Gate(catalog.size)
        record = GateRecorder(writer, run_id=self.run_id, ranks=self.ranks)
        self.store = FrameworkStore(gate, group=group, record=record, step=lambda: self.step)
        coordinator = GateCoordinator(gate, self.store, group=group, sweep=self.sweep)
        self._follow(driver, catalog, coordinator, vote)

    @property
    def step(self) -> int:
        """The SCOUT step a checkpoint taken now belongs to (the last completed iteration)."""
        return self.driver.step - 1

    @property
    def gate(self) -> Gate:
        """The Algorithm-3 state machine."""
        return self.coordinator.gate

    @property
    def ledger(self) -> Ledger:
        """Every tag the gate knows of, by directory, with its role."""
        return self.store.ledger

    @property
    def last_io(self) -> CheckpointIO | None:
        """The checkpoint IO of the most recent save, load or :meth:`target`."""
        return self.store.io

    def _selected(self, result: Any) -> None:
        pass  # the store logged the selection and the refusal of saves

    def target(self, io: CheckpointIO) -> None:
        """Make ``io`` what :meth:`recover` loads from (default: that of the last save or load)."""
        self.store.io = io

    # -- save ----------------------------------------------------------------------------

    def save(self, io: CheckpointIO, tag: str | None = None) -> bool:
        """Write checkpoint ``tag`` (default ``io.tag_for(step)``) through ``io`` and record
        its role; refused (False) while an SDC awaits recovery. Collective."""
        store, step = self.store, self.step
        name = io.tag_for(step) if tag is None else str(tag)
        if self.pending is not None:
            failure, at = self.pending.failure, self.pending.found_at
            reason = (
                f"{failure.value if failure else 'a failure'} found at step {at} "
                "and not recovered: the state may be corrupted"
            )
            log.warning(
                "refusing to save checkpoint %r in %s: %s; recover or load first",
                name,
                io.directory,
                reason,
            )
            detail = {"refused": True, "tag": name, "directory": io.directory, "reason": reason}
            store.record("capture", step, max(step, 0), failure=failure, detail=detail)
            return False
        store.use(io, strict=False)  # before the framework's first barrier
        error: BaseException | None = None
        ok = False
        try:
            ok = bool(io.save(name))
        except STORAGE_ERRORS as exc:  # a full or read-only disk, DCP's CheckpointException
            error = exc
        if not all_ok(error is None, store.group):
            why = describe(error) if error is not None else "failed on another rank"
            log.warning(
                "checkpoint %r in %s was not written (%s); skipped on every rank, training goes on",
                name,
                io.directory,
                why,
            )
            detail = {"skipped": True, "tag": name, "directory": io.directory, "reason": why}
            store.record("capture", step, max(step, 0), detail=detail)
            return False
        if not ok:
            return False
        if store.rotated_at == step:
            role, why = "candidate", f"saved when the recipe cycle closed clean at step {step}"
        else:
            role, why = "latest", "saved after a clean boundary; its recipe cycle is still open"
        entry = store.ledger.add(io.directory, name, step=step, role=role, reason=why)
        detail = {"tag": name, "directory": io.directory, "role": role, "reason": why}
        store.record("capture", step, max(step, 0), detail=detail)
        if role == "candidate":
            store.record("candidate", step, max(step, 0), detail=detail)
        store.write_sidecars({entry.directory})
        return True

    # -- load and recover ----------------------------------------------------------------

    def _load(self, io: CheckpointIO, entry: TagEntry | None, tag: str | None) -> Any:
        out, step = self.store.load(io, entry, tag)
        self.coordinator.pending = None
        self.driver.resume_at(step + 1)
        return out

    def load(self, io: CheckpointIO, tag: str | None = None) -> Any:
        """Restore ``tag``, or with no tag the newest *verified* tag of ``io.directory``;
        returns the framework's load result. Collective."""
        store = self.store
        has_sidecar = store.use(io)
        step = self.step
        if tag is not None:
            entry = store.ledger.get(io.directory, str(tag))
            role = "unknown to SCOUT" if entry is None else entry.role
            if entry is None or entry.role != "verified":
                log.warning("loading tag %r (%s) as asked; it is not verified", tag, role)
            out = self._load(io, entry, str(tag))
            sel = Selection.VERIFIED if role == "verified" else Selection.LATEST
            reason = f"explicit tag {tag!r} ({role})"
        else:
            entry = store.ledger.newest(("verified",), directory=io.directory)
            if entry is None:
                if self.pending is not None:
                    raise CheckpointError(
                        f"replay found {self.pending.failure} and {io.directory} holds no "
                        "verified tag: refusing to load an uncertified one (pass a tag to override)"
                    )
                why = "no certification sidecar" if not has_sidecar else "no verified tag yet"
                log.warning("%s in %s; loading the framework's latest", why, io.directory)
                out = self._load(io, None, None)
                sel, reason = Selection.LATEST, f"{why}: the framework's latest"
            else:
                log.warning(
                    "loading verified tag %r (step %d) from %s instead of the "
                    "framework's latest: the newest tag two clean recipe cycles vouch for",
                    entry.tag,
                    entry.step,
                    io.directory,
                )
                out = self._load(io, entry, entry.tag)
                sel, reason = Selection.VERIFIED, f"newest verified tag {entry.tag!r}"
        detail = {"phase": "restore", "tag": None if entry is None else entry.tag, "reason": reason}
        checkpoint_step = None if entry is None else max(entry.step, 0)
        store.record("retrieve", step, checkpoint_step, selected=sel, detail=detail)
        return out

    def recover(
        self, failure: Failure | str | None, *, machines_accessible: bool = True
    ) -> Recovered:
        """Load the tag the gate trusts after ``failure`` from :attr:`last_io`; collective."""
        got = self.coordinator.recover(
            None if failure is None else Failure(failure),
            step=self.step,
            machines_accessible=machines_accessible,
        )
        self.driver.resume_at(got.step + 1)
        return got

    def resume(self) -> None:
        """Not for a framework's gate: the framework loads its own checkpoints."""
        raise UnsupportedSetupError(
            "session.resume needs the in-memory checkpoint gate with Config.checkpoint_dir; "
            "a framework's gate loads its own checkpoints (session.checkpoints.load(io))"
        )
