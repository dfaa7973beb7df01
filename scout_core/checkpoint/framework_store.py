"""A framework's own checkpoints as the gate's generation store: :class:`FrameworkStore`.

Contract: the coordinator (:mod:`.coordinator`) calls it at each boundary; it moves the
saved tags' roles in the :class:`~.certification.Ledger`, mirrors them into each
directory's sidecar, and loads the tag a retrieval selects, agreed job-wide first.
Collective. Docs: docs/checkpoint_gate.md, "Checkpoints the framework owns".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scout_core.checkpoint.certification import (
    SELECTABLE_AS_LATEST,
    Ledger,
    TagEntry,
    read_sidecar,
    write_sidecar,
)
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.checkpoint.recorder import GateRecorder
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
from scout_core.errors import CheckpointError
from scout_core.vocabulary import Failure

__all__ = ["FrameworkStore"]

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
        """Load the tag ``found`` selected from :attr:`io`'s directory and record it. Collective."""
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
        """Load ``tag`` through ``io``, agreed job-wide first; the framework's result and the
        step. The cycle restarts and newer tags are no longer trusted. Collective."""
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
        """Adopt ``io``'s directory sidecar into the ledger once; whether one exists. Collective:
        one any rank cannot read raises on every rank when ``strict`` (a load must not pick a tag
        from a ledger it cannot trust), else it is logged and ignored (a save)."""
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
