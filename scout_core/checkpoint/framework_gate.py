"""Gating a framework's own checkpoints with the replay evidence: :class:`FrameworkGate`.

The in-memory gate (:class:`~scout_core.checkpoint.attach.GateHandle`) keeps its own host
copies of the training state. Under DeepSpeed, Megatron or TorchTitan the checkpoints that
matter are the ones the framework writes itself, at steps of the user's choosing, so the
core certifies *those*: a plugin says how its checkpoints are written and read
(:class:`~scout_core.checkpoint.io.CheckpointIO`) and routes the framework's save and load
through :meth:`FrameworkGate.save` and :meth:`FrameworkGate.load`; everything else happens
here, once, for every framework.

[The boundary]
Per replay boundary the gate reads this rank's outcome and the catalog slots checked
(:class:`~.catalog.GateCatalog`), combines the flags job-wide (in a session, in the
boundary's one all-reduce: :class:`~.catalog.GateSeat`) and lets the pure Algorithm-3
machine (:class:`~scout_core.decision.gate.Gate`) decide. The decision moves the
saved tags' roles in the :class:`~.certification.Ledger` and its sidecar:

* CAPTURE: nothing to move (the gate's ``latest`` advances);
* ROTATE (a cycle closed clean): the candidate tags become ``verified``, every
  ``latest`` tag saved up to this step becomes ``candidate``;
* SKIP (not clean): ``latest`` and ``candidate`` tags become ``uncertified``;
* RETRIEVE (SDC): ``latest``, ``candidate`` and ``uncertified`` tags become
  ``suspect``, and saves are refused until a load restores.

[Save, load, recover]
* :meth:`save` refuses (False, a logged warning and a record) while an SDC awaits
  recovery; otherwise it writes ``io.save(tag)`` and records the tag as
  ``candidate`` when saved exactly at a clean cycle close, else ``latest``;
* :meth:`load` with no tag loads the newest *verified* tag of the directory
  (fallback: the framework's own latest, with a warning; refused after an
  unrecovered SDC); an explicit tag is honoured, with a warning if not verified;
* :meth:`recover` is Algorithm 3's retrieval over the ledger: SDC or an
  unreachable machine → verified, a straggler → the newest tag SCOUT does not
  suspect, anything else → the full-catalog sweep decides.

The tag a load picks is agreed job-wide before the framework reads anything; a
load resets the gate's cycle and the replay step clock to the restored step.
Every rank calls these at the same point (the frameworks require it too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scout_core.checkpoint.catalog import GateCatalog, GateSeat, round_outcome
from scout_core.checkpoint.certification import (
    SELECTABLE_AS_LATEST,
    Ledger,
    TagEntry,
    read_sidecar,
    write_sidecar,
)
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.checkpoint.records import GateRecorder
from scout_core.checkpoint.storage import STORAGE_ERRORS, describe
from scout_core.decision.agreement import all_ok, same_value
from scout_core.decision.gate import (
    Action,
    Decision,
    Gate,
    Outcome,
    Retrieval,
    Selection,
    retrieval,
    worst,
)
from scout_core.decision.gate_wire import combine_outcome
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import CheckpointError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.vocabulary import Failure

__all__ = ["FrameworkGate"]

log = logging.getLogger(__name__)


class FrameworkGate:
    """The checkpoint gate of one framework's own checkpoints; one per rank (module doc)."""

    def __init__(
        self,
        driver: ReplayDriver,
        catalog: GateCatalog,
        *,
        group: dist.ProcessGroup,
        writer: EvidenceWriter | None,
        vote: BoundaryVote[Boundary] | None = None,
    ) -> None:
        self.driver = driver
        self.catalog = catalog
        self.group = group
        self.writer = writer
        self.ranks = tuple(range(dist.get_world_size()))
        self.run_id = driver.config.resolved_run_id()
        self._record = GateRecorder(writer, run_id=self.run_id, ranks=self.ranks)
        self.gate = Gate(catalog.size)
        self.ledger = Ledger()
        self.pending: Decision | None = None
        """The RETRIEVE decision of a boundary that found SDC, until a load restores."""
        self.last_io: CheckpointIO | None = None
        """The checkpoint IO of the most recent save or load (``recover``'s default)."""
        self._rotated_at: int | None = None
        self._merged: set[str] = set()
        self._writes = False
        self._closed = False
        self._seat = GateSeat(
            vote, catalog, lambda: self.gate, lambda: self.pending is not None, group
        )
        driver.keep_captures(True)
        self._unsubscribe = driver.on_boundary(self._on_boundary)
        if driver.peer_size < 2:
            log.warning("replay has no peers here; no checkpoint is ever verified")

    @property
    def step(self) -> int:
        """The SCOUT step a checkpoint taken now belongs to (the last completed iteration)."""
        return self.driver.step - 1

    # -- the boundary --------------------------------------------------------------------

    def _on_boundary(self, boundary: Boundary) -> None:
        agreed = self._seat.agree(boundary)  # None after SDC until a load restores
        if agreed is not None:
            self._apply(self.gate.decide(*agreed))

    def _apply(self, d: Decision) -> None:
        ledger, step = self.ledger, d.step
        detail: dict[str, Any] = {"K": self.gate.catalog_size, "reason": d.reason}
        changed: list[TagEntry] = []
        if d.action is Action.RETRIEVE:
            self.pending = d
            what = d.failure.value if d.failure else "failure"
            why = f"saved after the last verified tag; {what} found at step {step}"
            changed = ledger.set_role(
                ledger.with_role("latest", "candidate", "uncertified"), "suspect", why
            )
            found, pick = self._retrieval(d.failure, None)
            self._record(
                "retrieve",
                step,
                None if pick is None else max(pick.step, 0),
                selected=found.selected,
                failure=d.failure,
                detail={**detail, "phase": "select", "tag": None if pick is None else pick.tag},
            )
            log.warning(
                "%s at step %d; checkpoint saves are refused until a load restores "
                "(recover(%r) would load %s)",
                what,
                step,
                what,
                pick.tag if pick is not None else "nothing: no verified tag",
            )
        elif d.action is Action.SKIP:
            self.gate.apply(d)
            self._rotated_at = None
            dropped = ledger.with_role("latest", "candidate")
            changed = ledger.set_role(dropped, "uncertified", f"step {step}: {d.reason}")
            for e in changed:
                self._record(
                    "candidate",
                    step,
                    max(e.step, 0),
                    detail={**detail, "tag": e.tag, "dropped": True},
                )
        elif d.action is Action.CAPTURE:
            self.gate.apply(d)
        elif d.action is Action.ROTATE:
            self.gate.apply(d)
            self._rotated_at = step
            held = ledger.with_role("candidate")
            if d.promote is not None:
                why = f"candidate survived the clean cycle closed at step {step}"
                changed += ledger.set_role(held, "verified", why)
                for e in changed:
                    self._record("promote", step, max(e.step, 0), detail={**detail, "tag": e.tag})
            else:  # defensive: the gate holds no candidate, so no tag can be one
                changed += ledger.set_role(held, "uncertified", "no gate candidate to promote")
            fresh = [e for e in ledger.with_role("latest") if e.step <= step]
            made = ledger.set_role(
                fresh, "candidate", f"its recipe cycle closed clean at step {step}"
            )
            for e in made:
                self._record("candidate", step, max(e.step, 0), detail={**detail, "tag": e.tag})
            changed += made
        if changed:
            self._write_sidecars(ledger.dirs(changed))

    # -- sidecars ------------------------------------------------------------

    def _use(self, io: CheckpointIO, *, strict: bool = True) -> bool:
        """Adopt ``io``'s directory sidecar into the ledger once; whether one exists.

        Collective: every rank reads the sidecar and the ranks agree that each could.
        An unreadable one (malformed, tampered, unreadable disk) raises
        :class:`CheckpointError` on every rank when ``strict`` (a load must not pick a
        tag on a ledger it cannot trust); otherwise it is logged and ignored (a save).
        """
        self.last_io = io
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

    def _write_sidecars(self, dirs: Iterable[str]) -> None:
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
            step = max(self.step, 0)
            detail = {"skipped": True, "durable": False, "storage_error": f"sidecar: {why}"}
            self._record("capture", step, step, detail=detail)

    # -- save ----------------------------------------------------------------------------

    def save(self, io: CheckpointIO, tag: str | None = None) -> bool:
        """Write checkpoint ``tag`` (default ``io.tag_for(step)``) through ``io`` and record
        its role; refused (False) while an SDC awaits recovery. Collective."""
        step = self.step
        name = io.tag_for(step) if tag is None else str(tag)
        if self.pending is not None:
            failure = self.pending.failure
            reason = (
                f"{failure.value if failure else 'a failure'} found at step {self.pending.step} "
                "and not recovered: the state may be corrupted"
            )
            log.warning(
                "refusing to save checkpoint %r in %s: %s; recover or load first",
                name,
                io.directory,
                reason,
            )
            detail = {"refused": True, "tag": name, "directory": io.directory, "reason": reason}
            self._record("capture", step, max(step, 0), failure=failure, detail=detail)
            return False
        self._use(io, strict=False)  # before the framework's first barrier
        error: BaseException | None = None
        ok = False
        try:
            ok = bool(io.save(name))
        except STORAGE_ERRORS as exc:  # a full or read-only disk, DCP's CheckpointException
            error = exc
        if not all_ok(error is None, self.group):
            why = describe(error) if error is not None else "failed on another rank"
            log.warning(
                "checkpoint %r in %s was not written (%s); skipped on every rank, training goes on",
                name,
                io.directory,
                why,
            )
            detail = {"skipped": True, "tag": name, "directory": io.directory, "reason": why}
            self._record("capture", step, max(step, 0), detail=detail)
            return False
        if not ok:
            return False
        if self._rotated_at is not None and self._rotated_at == step:
            role, why = "candidate", f"saved when the recipe cycle closed clean at step {step}"
        else:
            role, why = "latest", "saved after a clean boundary; its recipe cycle is still open"
        entry = self.ledger.add(io.directory, name, step=step, role=role, reason=why)
        detail = {"tag": name, "directory": io.directory, "role": role, "reason": why}
        self._record("capture", step, max(step, 0), detail=detail)
        if role == "candidate":
            self._record("candidate", step, max(step, 0), detail=detail)
        self._write_sidecars({entry.directory})
        return True

    # -- load and recover ----------------------------------------------------------------

    def _retrieval(
        self,
        failure: Failure | None,
        directory: str | None,
        *,
        machines_accessible: bool = True,
        sweep: bool = False,
    ) -> tuple[Retrieval, TagEntry | None]:
        latest = self.ledger.newest(SELECTABLE_AS_LATEST, directory=directory)
        verified = self.ledger.newest(("verified",), directory=directory)
        found = retrieval(
            failure,
            latest=None if latest is None else latest.step,
            verified=None if verified is None else verified.step,
            machines_accessible=machines_accessible,
            sweep=self._job_sweep if sweep else None,
        )
        return found, verified if found.selected is Selection.VERIFIED else latest

    def _job_sweep(self) -> Outcome:
        """Every catalog recipe now, combined job-wide (Algorithm 3's retrieval sweep)."""
        rounds = self.driver.sweep(self.catalog.recipes)
        mine = worst(round_outcome(r) for r in rounds)  # no peers: MISSING, fail closed
        return combine_outcome(mine, group=self.group)

    def _restore(self, io: CheckpointIO, entry: TagEntry | None, tag: str | None) -> Any:
        """Load ``tag`` through ``io``, agreed job-wide first, then reset gate and clock."""
        if not same_value((tag, None if entry is None else entry.step), self.group):
            raise CheckpointError(f"ranks disagree about the tag to load (this rank: {tag!r})")
        out = io.load(tag)
        step = entry.step if entry is not None else int(io.restored_step())
        self.gate.after_restore(Selection.VERIFIED, step)  # the recipe cycle restarts
        self._rotated_at = None
        if self.pending is None:
            stale = self.ledger.with_role("latest", "candidate")
            changed = self.ledger.set_role(stale, "uncertified", f"training jumped to step {step}")
            if changed:
                self._write_sidecars(self.ledger.dirs(changed))
        self.pending = None
        self.driver.resume_at(step + 1)
        return out

    def load(self, io: CheckpointIO, tag: str | None = None) -> Any:
        """Restore ``tag``, or with no tag the newest *verified* tag of ``io.directory``;
        returns the framework's load result. Collective."""
        has_sidecar = self._use(io)
        step = self.step
        if tag is not None:
            entry = self.ledger.get(io.directory, str(tag))
            role = "unknown to SCOUT" if entry is None else entry.role
            if entry is None or entry.role != "verified":
                log.warning("loading tag %r (%s) as asked; it is not verified", tag, role)
            out = self._restore(io, entry, str(tag))
            sel = Selection.VERIFIED if role == "verified" else Selection.LATEST
            reason = f"explicit tag {tag!r} ({role})"
        else:
            entry = self.ledger.newest(("verified",), directory=io.directory)
            if entry is None:
                if self.pending is not None:
                    raise CheckpointError(
                        f"replay found {self.pending.failure} and {io.directory} holds no "
                        "verified tag: refusing to load an uncertified one (pass a tag to override)"
                    )
                why = "no certification sidecar" if not has_sidecar else "no verified tag yet"
                log.warning("%s in %s; loading the framework's latest", why, io.directory)
                out = self._restore(io, None, None)
                sel, reason = Selection.LATEST, f"{why}: the framework's latest"
            else:
                log.warning(
                    "loading verified tag %r (step %d) from %s instead of the "
                    "framework's latest: the newest tag two clean recipe cycles vouch for",
                    entry.tag,
                    entry.step,
                    io.directory,
                )
                out = self._restore(io, entry, entry.tag)
                sel, reason = Selection.VERIFIED, f"newest verified tag {entry.tag!r}"
        detail = {"phase": "restore", "tag": None if entry is None else entry.tag, "reason": reason}
        checkpoint_step = None if entry is None else max(entry.step, 0)
        self._record("retrieve", step, checkpoint_step, selected=sel, detail=detail)
        return out

    def recover(
        self,
        failure: Failure | str | None,
        io: CheckpointIO | None = None,
        *,
        machines_accessible: bool = True,
    ) -> Recovered:
        """Load the tag the gate trusts after ``failure`` from ``io`` (default: the IO of
        the last save or load). Collective; writes a retrieve record."""
        io = self.last_io if io is None else io
        if io is None:
            raise CheckpointError("recover needs a checkpoint directory: nothing was saved yet")
        self._use(io)
        found_failure = None if failure is None else Failure(failure)
        step = self.step
        found, entry = self._retrieval(
            found_failure, io.directory, machines_accessible=machines_accessible, sweep=True
        )
        if entry is None:
            what = found_failure.value if found_failure else "the failure"
            raise CheckpointError(
                f"no {found.selected.value} checkpoint in {io.directory} to recover from after "
                f"{what} ({found.reason})"
            )
        self._restore(io, entry, entry.tag)
        self._record(
            "retrieve",
            step,
            max(entry.step, 0),
            selected=found.selected,
            failure=found_failure,
            detail={"phase": "restore", "tag": entry.tag, "reason": found.reason},
        )
        return Recovered(entry.tag, entry.step, found.selected.value, found.reason)

    def close(self) -> None:
        """Unsubscribe from the driver (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        self.driver.keep_captures(False)
