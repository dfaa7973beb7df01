"""Gating a framework's own checkpoints with the replay evidence: :class:`FrameworkGate`.

A plugin says how its checkpoints are written and read
(:class:`~scout_core.checkpoint.io.CheckpointIO`) and routes the framework's save and load
through :meth:`FrameworkGate.save` and :meth:`FrameworkGate.load`; the rest happens here,
once, for every framework. Contract: the one coordinator drives :class:`FrameworkStore`,
which moves the saved tags' roles in the :class:`~.certification.Ledger`; a save is
refused while an SDC awaits recovery; a load without a tag picks the newest verified tag,
agreed job-wide before the framework reads anything, and resets the gate's cycle and the
step clock; :meth:`FrameworkGate.recover` is Algorithm 3's retrieval over the ledger.
Every rank calls these at the same point. Docs: docs/checkpoint_gate.md, "Checkpoints the
framework owns".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scout_core.checkpoint.catalog import GateCatalog
from scout_core.checkpoint.certification import (
    SELECTABLE_AS_LATEST,
    Ledger,
    TagEntry,
    read_sidecar,
    write_sidecar,
)
from scout_core.checkpoint.coordinator import GateCoordinator
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.checkpoint.records import GateRecorder
from scout_core.checkpoint.session_gate import SessionGate
from scout_core.checkpoint.storage import STORAGE_ERRORS, describe
from scout_core.decision.agreement import all_ok, same_value
from scout_core.decision.gate import (
    Decision,
    Gate,
    Outcome,
    Retrieval,
    Selection,
    retrieval,
)
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import CheckpointError, UnsupportedSetupError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.vocabulary import Failure

__all__ = ["FrameworkGate", "FrameworkStore"]

log = logging.getLogger(__name__)


class FrameworkStore:
    """A framework's own checkpoints as the gate's generation store (module doc)."""

    def __init__(
        self, gate: Gate, *, group: dist.ProcessGroup, record: GateRecorder, step: Callable[[], int]
    ) -> None:
        self.gate = gate
        self.group = group
        self.record = record
        self.run_id = record.run_id
        self.step = step
        """The SCOUT step a checkpoint taken now belongs to."""
        self.ledger = Ledger()
        self.io: CheckpointIO | None = None
        """The checkpoint IO of the most recent save or load (what ``recover`` loads)."""
        self.rotated_at: int | None = None
        """The step of the last clean cycle close, until a skip or a restore."""
        self._merged: set[str] = set()
        self._writes = False

    # -- the boundary --------------------------------------------------------------------

    def capture(self, decision: Decision, extra: Mapping[str, Any] | None) -> float | None:
        """Nothing to copy: the framework saves at steps of the user's choosing."""
        return 0.0

    def promote(self, decision: Decision, detail: Mapping[str, Any]) -> None:
        """ROTATE: candidate tags become verified, ``latest`` tags up to now candidates."""
        ledger, step = self.ledger, decision.step
        info = {"K": detail["K"], "reason": decision.reason}
        self.rotated_at = step
        held = ledger.with_role("candidate")
        changed: list[TagEntry] = []
        if decision.promote is not None:
            why = f"candidate survived the clean cycle closed at step {step}"
            changed += ledger.set_role(held, "verified", why)
            for e in changed:
                self.record("promote", step, max(e.step, 0), detail={**info, "tag": e.tag})
        else:  # defensive: the gate holds no candidate, so no tag can be one
            changed += ledger.set_role(held, "uncertified", "no gate candidate to promote")
        fresh = [e for e in ledger.with_role("latest") if e.step <= step]
        made = ledger.set_role(fresh, "candidate", f"its recipe cycle closed clean at step {step}")
        for e in made:
            self.record("candidate", step, max(e.step, 0), detail={**info, "tag": e.tag})
        self._changed(changed + made)

    def drop_candidate(self, decision: Decision, detail: Mapping[str, Any]) -> None:
        """SKIP: ``latest`` and ``candidate`` tags become uncertified."""
        ledger, step = self.ledger, decision.step
        info = {"K": detail["K"], "reason": decision.reason}
        self.rotated_at = None
        dropped = ledger.with_role("latest", "candidate")
        changed = ledger.set_role(dropped, "uncertified", f"step {step}: {decision.reason}")
        for e in changed:
            detail_e = {**info, "tag": e.tag, "dropped": True}
            self.record("candidate", step, max(e.step, 0), detail=detail_e)
        self._changed(changed)

    def _changed(self, changed: list[TagEntry]) -> None:
        if changed:
            self.write_sidecars(self.ledger.dirs(changed))

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
        """Algorithm 3's retrieval over the ledger. At a RETRIEVE ``boundary`` every tag
        not verified becomes suspect and the pick is recorded (no sweep: saves are
        refused until a load); for a recovery, over the directory of :attr:`io`."""
        if boundary is None:
            io = self._io()
            self.use(io)
            return self._retrieval(failure, io.directory, machines_accessible, sweep)[0]
        ledger = self.ledger
        what = failure.value if failure else "failure"
        why = f"saved after the last verified tag; {what} found at step {step}"
        suspects = ledger.set_role(
            ledger.with_role("latest", "candidate", "uncertified"), "suspect", why
        )
        found, pick = self._retrieval(failure, None, True, None)
        detail = {"K": self.gate.catalog_size, "reason": boundary.reason, "phase": "select"}
        self.record(
            "retrieve",
            step,
            None if pick is None else max(pick.step, 0),
            selected=found.selected,
            failure=failure,
            detail={**detail, "tag": None if pick is None else pick.tag},
        )
        log.warning(
            "%s at step %d; checkpoint saves are refused until a load restores "
            "(recover(%r) would load %s)",
            what,
            step,
            what,
            pick.tag if pick is not None else "nothing: no verified tag",
        )
        self._changed(suspects)
        return found

    def _io(self) -> CheckpointIO:
        if self.io is None:
            raise CheckpointError("recover needs a checkpoint directory: nothing was saved yet")
        return self.io

    def _retrieval(
        self,
        failure: Failure | None,
        directory: str | None,
        machines_accessible: bool,
        sweep: Callable[[], Outcome] | None,
    ) -> tuple[Retrieval, TagEntry | None]:
        latest = self.ledger.newest(SELECTABLE_AS_LATEST, directory=directory)
        verified = self.ledger.newest(("verified",), directory=directory)
        found = retrieval(
            failure,
            latest=None if latest is None else latest.step,
            verified=None if verified is None else verified.step,
            machines_accessible=machines_accessible,
            sweep=sweep,
        )
        return found, verified if found.selected is Selection.VERIFIED else latest

    def restore(
        self,
        found: Retrieval,
        failure: Failure | None,
        *,
        step: int | None = None,
        extra: MutableMapping[str, Any] | None = None,
    ) -> Recovered:
        """Load the tag ``found`` selected from the directory of :attr:`io`; writes a
        retrieve record. Collective."""
        io = self._io()
        roles = ("verified",) if found.selected is Selection.VERIFIED else SELECTABLE_AS_LATEST
        entry = self.ledger.newest(roles, directory=io.directory)
        if entry is None:
            what = failure.value if failure else "the failure"
            raise CheckpointError(
                f"no {found.selected.value} checkpoint in {io.directory} to recover from after "
                f"{what} ({found.reason})"
            )
        self.load(io, entry, entry.tag)
        self.record(
            "retrieve",
            self.step() if step is None else step,
            max(entry.step, 0),
            selected=found.selected,
            failure=failure,
            detail={"phase": "restore", "tag": entry.tag, "reason": found.reason},
        )
        return Recovered(entry.tag, entry.step, found.selected.value, found.reason)

    def load(self, io: CheckpointIO, entry: TagEntry | None, tag: str | None) -> tuple[Any, int]:
        """Load ``tag`` through ``io``, agreed job-wide first; the cycle restarts and the
        tags newer than what was loaded are no longer trusted. The framework's load
        result and the step loaded. Collective."""
        if not same_value((tag, None if entry is None else entry.step), self.group):
            raise CheckpointError(f"ranks disagree about the tag to load (this rank: {tag!r})")
        out = io.load(tag)
        step = entry.step if entry is not None else int(io.restored_step())
        self.gate.after_restore(Selection.VERIFIED, step)  # the recipe cycle restarts
        self.rotated_at = None
        stale = self.ledger.with_role("latest", "candidate")  # none after an SDC: suspect
        self._changed(self.ledger.set_role(stale, "uncertified", f"training jumped to step {step}"))
        return out, step

    # -- sidecars ------------------------------------------------------------------------

    def use(self, io: CheckpointIO, *, strict: bool = True) -> bool:
        """Adopt ``io``'s directory sidecar into the ledger once; whether one exists.

        Collective: every rank reads the sidecar and the ranks agree that each could.
        An unreadable one (malformed, tampered, unreadable disk) raises
        :class:`CheckpointError` on every rank when ``strict`` (a load must not pick a
        tag on a ledger it cannot trust); otherwise it is logged and ignored (a save).
        """
        self.io = io
        self._writes = io.writes_metadata()
        where = str(Path(io.directory).resolve())
        error: BaseException | None = None
        found = None
        try:
            found = read_sidecar(io.directory)
        except STORAGE_ERRORS as exc:
            error = exc
        if not all_ok(error is None, self.group):
            why = f"this rank: {describe(error)}" if error is not None else "another rank"
            if strict:
                raise CheckpointError(
                    f"the certification sidecar in {io.directory} cannot be trusted ({why}); "
                    "refusing to pick a tag from it on every rank"
                ) from error
            log.warning("ignoring the unreadable sidecar in %s (%s)", io.directory, why)
            return False
        if where not in self._merged:
            self._merged.add(where)
            if found is not None:
                self.ledger.merge(io.directory, found)
        return found is not None

    def write_sidecars(self, dirs: Iterable[str]) -> None:
        """Mirror the ledger of ``dirs`` into their sidecars (the writing rank), and agree
        that it worked; a failure is logged and recorded, never raised. Collective."""
        error: BaseException | None = None
        if self._writes:
            try:
                for where in sorted(dirs):
                    if Path(where).is_dir():
                        entries = self.ledger.in_dir(where)
                        write_sidecar(
                            where, entries, run_id=self.run_id, catalog_size=self.gate.catalog_size
                        )
            except STORAGE_ERRORS as exc:
                error = exc
        if not all_ok(error is None, self.group):
            why = describe(error) if error is not None else "on the rank that writes it"
            log.warning("could not write the certification sidecar (%s)", why)
            step = max(self.step(), 0)
            detail = {"skipped": True, "durable": False, "storage_error": f"sidecar: {why}"}
            self.record("capture", step, step, detail=detail)

    def close(self) -> None:
        """Nothing to release: the framework owns its checkpoints."""


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
        """Make ``io`` (a directory and how to read it) what :meth:`recover` loads from;
        by default, the IO of the last save or load."""
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
        """Load the tag the gate trusts after ``failure`` from the directory of the last
        save, load or :meth:`target`. Collective; writes a retrieve record."""
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
