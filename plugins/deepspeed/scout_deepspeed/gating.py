"""Checkpoint gating through one engine's ``save_checkpoint`` / ``load_checkpoint``.

The core's in-memory gate (:class:`scout_core.checkpoint.GateHandle`) keeps its own
host copies of model and optimizer; under DeepSpeed the checkpoints that matter are
the ones the user (or the HF Trainer) writes with ``engine.save_checkpoint``. So the
plugin certifies *those*: :class:`EngineGate` feeds the pure Algorithm-3 state
machine (:class:`scout_core.decision.gate.Gate`) with each replay boundary's outcome and
moves the saved tags' roles in a :class:`~scout_deepspeed.certification.Ledger`.

[The boundary]
An optimizer step post-hook registered *after* the replay driver's (hooks fire in
registration order) reads the recipe rounds replay just appended to
``session.rounds``, maps each due recipe to a gate outcome with the core's
``round_outcome`` and to its catalog index (``gate_catalog``, folded onto
``Config.catalog_size``), and combines the flags job-wide with
``scout_core.decision.gate.combine`` on a diagnostic Gloo group before the gate changes
state. The same steps as ``GateHandle._post_step``, without its in-memory capture.

[The seam]
DeepSpeed has no hook around checkpoint I/O, so the engine *instance* gets its own
``save_checkpoint`` and ``load_checkpoint`` attributes (the class is untouched;
``close`` deletes them again):

* ``save_checkpoint`` refuses (returns ``False``, writes nothing, logs a warning and
  a ``scout.checkpoint/1`` record) while replay's SDC awaits recovery; otherwise it
  calls DeepSpeed and records the tag in the ledger and the sidecar;
* ``load_checkpoint(dir)`` with no tag loads the newest *verified* tag of the
  sidecar instead of DeepSpeed's ``latest`` file; an explicit tag is honoured;
* :func:`recover` picks verified or latest per ``scout_core.decision.gate.retrieval``.

Every rank must call them at the same point (DeepSpeed requires it too); the
ledger and the gate are identical on every rank, and the tag a load picks is
checked job-wide before DeepSpeed reads anything.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from scout_core.checkpoint.attach import gate_catalog, round_outcome
from scout_core.checkpoint.coordinator import write_gate_record
from scout_core.decision.gate import (
    Action,
    Decision,
    Gate,
    Retrieval,
    Selection,
    combine,
    retrieval,
    worst,
)
from scout_core.errors import CheckpointError, ConfigError, UnsupportedSetupError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.driver import ReplayDriver
from scout_core.replay.schedule import Recipe
from scout_core.session import Session
from scout_core.vocabulary import Failure
from scout_deepspeed.certification import (
    SELECTABLE_AS_LATEST,
    Ledger,
    TagEntry,
    read_sidecar,
    write_sidecar,
)

__all__ = ["EngineGate", "Recovered", "attach_checkpoint_gate", "gate_of", "recover"]

log = logging.getLogger("scout.deepspeed")

_gates: weakref.WeakKeyDictionary[Any, EngineGate] = weakref.WeakKeyDictionary()


class Recovered(NamedTuple):
    """What :func:`recover` loaded."""

    tag: str
    step: int
    role: str
    """What the retrieval selected: ``verified`` or ``latest``."""
    reason: str


def _key(recipe: Recipe) -> tuple[str, str | None]:
    return (recipe.kind, recipe.path)


def _digest(value: object) -> int:
    raw = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 2


def _agree(value: object, group: dist.ProcessGroup, what: str) -> None:
    """Raise CheckpointError on every rank unless every rank passed an equal ``value``."""
    d = _digest(value)
    words = torch.tensor([d, -d], dtype=torch.int64)
    dist.all_reduce(words, op=dist.ReduceOp.MAX, group=group)
    hi, neg_lo = (int(w) for w in words.tolist())
    if hi != -neg_lo:
        raise CheckpointError(f"ranks disagree about {what} (this rank: {value!r})")


class EngineGate:
    """The checkpoint gate of one DeepSpeed engine; one per rank. See the module doc."""

    def __init__(
        self,
        engine: Any,
        session: Session,
        driver: ReplayDriver,
        writer: EvidenceWriter | None,
        *,
        catalog: tuple[Recipe, ...],
        size: int,
        group: dist.ProcessGroup,
    ) -> None:
        self.engine = engine
        self.session = session
        self.driver = driver
        self.writer = writer
        self.group = group
        self.ranks = tuple(range(dist.get_world_size()))
        self.run_id = session.config.resolved_run_id()
        self.gate = Gate(size)
        self.ledger = Ledger()
        self.pending: Decision | None = None
        """The RETRIEVE decision of a boundary that found SDC, until a load restores."""
        self._index = {_key(r): i % size for i, r in enumerate(catalog)}
        self._rotated_at: int | None = None
        self._merged: set[str] = set()
        self._seen = len(session.rounds)
        self._closed = False
        # DeepSpeed writes 'latest' from this rank; the sidecar follows the same rule.
        local = bool(getattr(engine, "use_node_local_storage", lambda: False)())
        self._writes = int(engine.local_rank if local else engine.global_rank) == 0
        self._save = engine.save_checkpoint
        self._load = engine.load_checkpoint
        # Instance attributes shadow the class's methods until close() (nn.Module's
        # __setattr__ stores plain callables in the instance __dict__).
        engine.save_checkpoint = self.save_checkpoint
        engine.load_checkpoint = self.load_checkpoint
        self._hook = driver.optimizer.register_step_post_hook(self._post_step)
        if driver.peer_size < 2:
            log.warning("scout: replay has no peers here; no DeepSpeed tag is ever verified")

    # -- the boundary --------------------------------------------------------------------

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        step = self.session.step - 1  # the driver's hook already advanced it
        fresh = self.session.rounds[self._seen :]
        self._seen = len(self.session.rounds)
        schedule = self.driver.schedule
        if not schedule.any_due(step):
            return
        due = [
            r
            for r in schedule.due(step, optimizer_slices=self.driver.opt.slices())
            if _key(r) in self._index
        ]
        if not due or self.pending is not None:
            return  # after SDC nothing is certified until a load restores
        outcomes = [
            worst(round_outcome(o) for o in fresh if o.step == step and _key(o.recipe) == _key(r))
            for r in due
        ]
        local = self.gate.local_flags(step, worst(outcomes), [self._index[_key(r)] for r in due])
        decision = self.gate.decide(combine(local, group=self.group), local)
        self._apply(decision)

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
            found, pick = self._retrieval(d.failure)
            self._record(
                "retrieve",
                step,
                None if pick is None else max(pick.step, 0),
                selected=found.selected,
                failure=d.failure,
                detail={**detail, "phase": "select", "tag": None if pick is None else pick.tag},
            )
            log.warning(
                "scout: %s at step %d; DeepSpeed saves are refused until a load restores "
                "(scout_deepspeed.recover(engine, %r) would load %s)",
                d.failure.value if d.failure else "failure",
                step,
                d.failure.value if d.failure else None,
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
                changed += ledger.set_role(
                    held, "verified", f"candidate survived the clean cycle closed at step {step}"
                )
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

    # -- records and sidecars ------------------------------------------------------------

    def _record(
        self,
        action: str,
        step: int,
        checkpoint_step: int | None,
        *,
        selected: Selection | None = None,
        failure: Failure | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        write_gate_record(
            self.writer,
            run_id=self.run_id,
            ranks=self.ranks,
            action=action,
            step=max(step, 0),
            checkpoint_step=checkpoint_step,
            selected=selected,
            failure=failure,
            detail=detail,
        )

    def _merge(self, save_dir: str | Path) -> bool:
        """Adopt ``save_dir``'s sidecar into the ledger once; whether it exists."""
        where = str(Path(save_dir).resolve())
        found = read_sidecar(save_dir)
        if where not in self._merged:
            self._merged.add(where)
            if found is not None:
                self.ledger.merge(save_dir, found)
        return found is not None

    def _write_sidecars(self, dirs: Iterable[str]) -> None:
        if not self._writes:
            return
        for where in sorted(dirs):
            if Path(where).is_dir():
                write_sidecar(
                    where,
                    self.ledger.in_dir(where),
                    run_id=self.run_id,
                    catalog_size=self.gate.catalog_size,
                )

    # -- save ----------------------------------------------------------------------------

    def save_checkpoint(self, save_dir: str, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``engine.save_checkpoint``, refused while replay's SDC awaits recovery."""
        step = self.session.step - 1
        name = str(tag) if tag is not None else f"global_step{self.engine.global_steps}"
        if self.pending is not None:
            failure = self.pending.failure
            reason = (
                f"{failure.value if failure else 'a failure'} found at step {self.pending.step} "
                "and not recovered: the state may be corrupted"
            )
            log.warning(
                "scout: refusing engine.save_checkpoint(%r, tag=%r): %s; call "
                "scout_deepspeed.recover(engine, 'sdc') or engine.load_checkpoint(dir) first",
                save_dir,
                name,
                reason,
            )
            self._record(
                "capture",
                step,
                max(step, 0),
                failure=failure,
                detail={"refused": True, "tag": name, "save_dir": str(save_dir), "reason": reason},
            )
            return False
        self._merge(save_dir)  # before DeepSpeed's first barrier: every rank reads the same file
        ok = self._save(save_dir, tag, *args, **kwargs)
        if not ok:
            return ok
        if self._rotated_at is not None and self._rotated_at == step:
            role, why = "candidate", f"saved when the recipe cycle closed clean at step {step}"
        else:
            role, why = "latest", "saved after a clean boundary; its recipe cycle is still open"
        entry = self.ledger.add(
            save_dir,
            name,
            step=step,
            global_steps=int(self.engine.global_steps),
            role=role,
            reason=why,
        )
        detail = {"tag": name, "save_dir": str(save_dir), "role": role, "reason": why}
        self._record("capture", step, max(step, 0), detail=detail)
        if role == "candidate":
            self._record("candidate", step, max(step, 0), detail=detail)
        self._write_sidecars({entry.save_dir})
        return ok

    # -- load ----------------------------------------------------------------------------

    def _retrieval(
        self, failure: Failure | None, save_dir: str | Path | None = None
    ) -> tuple[Retrieval, TagEntry | None]:
        latest = self.ledger.newest(SELECTABLE_AS_LATEST, save_dir=save_dir)
        verified = self.ledger.newest(("verified",), save_dir=save_dir)
        # No full-catalog sweep here: a failure that is neither SDC nor slowness
        # selects verified (fail closed), as retrieval() does without a sweep.
        found = retrieval(
            failure,
            latest=None if latest is None else latest.step,
            verified=None if verified is None else verified.step,
        )
        return found, verified if found.selected is Selection.VERIFIED else latest

    def _restore(
        self, load_dir: str, entry: TagEntry | None, tag: str | None, *args: Any, **kwargs: Any
    ) -> Any:
        """Load ``tag`` with DeepSpeed, checked job-wide first, then reset the gate."""
        _agree((tag, None if entry is None else entry.step), self.group, "the tag to load")
        out = self._load(load_dir, tag, *args, **kwargs)
        if out is None or out[0] is None:
            return out
        step = entry.step if entry is not None else int(self.engine.global_steps) - 1
        self.gate.after_restore(Selection.VERIFIED, step)  # the recipe cycle restarts
        self._rotated_at = None
        if self.pending is None:
            stale = self.ledger.with_role("latest", "candidate")
            changed = self.ledger.set_role(stale, "uncertified", f"training jumped to step {step}")
            if changed:
                self._write_sidecars(self.ledger.dirs(changed))
        self.pending = None
        resume = step + 1
        self.session.step = resume
        schedule = self.driver.schedule
        due = schedule.modules_due(resume) if schedule.any_due(resume) else set()
        self.driver.capturer.arm(resume, due)
        return out

    def load_checkpoint(self, load_dir: str, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``engine.load_checkpoint``; with no tag, the newest *verified* tag of the sidecar."""
        has_sidecar = self._merge(load_dir)
        step = self.session.step - 1
        if tag is not None:
            entry = self.ledger.get(load_dir, str(tag))
            role = "unknown to SCOUT" if entry is None else entry.role
            if entry is None or entry.role != "verified":
                log.warning("scout: loading tag %r (%s) as asked; it is not verified", tag, role)
            out = self._restore(load_dir, entry, str(tag), *args, **kwargs)
            sel = Selection.VERIFIED if role == "verified" else Selection.LATEST
            reason = f"explicit tag {tag!r} ({role})"
        else:
            entry = self.ledger.newest(("verified",), save_dir=load_dir)
            if entry is None:
                if self.pending is not None:
                    raise CheckpointError(
                        f"replay found {self.pending.failure} and {load_dir} holds no verified "
                        "tag: refusing to load an uncertified one (pass tag= to override)"
                    )
                why = "no certification sidecar" if not has_sidecar else "no verified tag yet"
                log.warning("scout: %s in %s; loading DeepSpeed's 'latest' tag", why, load_dir)
                out = self._restore(load_dir, None, None, *args, **kwargs)
                sel, reason = Selection.LATEST, f"{why}: DeepSpeed's latest"
            else:
                log.warning(
                    "scout: loading verified tag %r (step %d) from %s instead of DeepSpeed's "
                    "'latest': it is the newest tag two clean recipe cycles vouch for",
                    entry.tag,
                    entry.step,
                    load_dir,
                )
                out = self._restore(load_dir, entry, entry.tag, *args, **kwargs)
                sel, reason = Selection.VERIFIED, f"newest verified tag {entry.tag!r}"
        if out is not None and out[0] is not None:
            self._record(
                "retrieve",
                step,
                None if entry is None else max(entry.step, 0),
                selected=sel,
                detail={
                    "phase": "restore",
                    "tag": None if entry is None else entry.tag,
                    "path": str(out[0]),
                    "reason": reason,
                },
            )
        return out

    def recover(
        self, failure: Failure | str | None, *, load_dir: str | None = None, **kwargs: Any
    ) -> Recovered:
        """Load the tag the gate trusts after ``failure`` (see :func:`recover`)."""
        if load_dir is not None:
            self._merge(load_dir)
        found_failure = None if failure is None else Failure(failure)
        step = self.session.step - 1
        found, entry = self._retrieval(found_failure, load_dir)
        if entry is None:
            raise CheckpointError(
                f"no {found.selected.value} DeepSpeed tag to recover from after "
                f"{found_failure.value if found_failure else 'the failure'} ({found.reason})"
            )
        out = self._restore(entry.save_dir, entry, entry.tag, **kwargs)
        if out is None or out[0] is None:
            raise CheckpointError(
                f"DeepSpeed could not load tag {entry.tag!r} from {entry.save_dir}"
            )
        self._record(
            "retrieve",
            step,
            max(entry.step, 0),
            selected=found.selected,
            failure=found_failure,
            detail={
                "phase": "restore",
                "tag": entry.tag,
                "path": str(out[0]),
                "reason": found.reason,
            },
        )
        return Recovered(entry.tag, entry.step, found.selected.value, found.reason)

    def close(self) -> None:
        """Remove the hook and give the engine its own methods back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._hook.remove()
        for name, mine in (
            ("save_checkpoint", self.save_checkpoint),
            ("load_checkpoint", self.load_checkpoint),
        ):
            if self.engine.__dict__.get(name) == mine:
                del self.engine.__dict__[name]
        _gates.pop(self.engine, None)


def gate_of(engine: Any) -> EngineGate | None:
    """The checkpoint gate attached to ``engine``, or None."""
    return _gates.get(engine)


def attach_checkpoint_gate(engine: Any, session: Session) -> EngineGate | None:
    """Gate ``engine``'s checkpoints with ``session``'s replay. Collective over the job.

    Returns None (and attaches nothing) when the gate is off, replay has no catalog,
    or the ranks' schedules differ in shape (a pipeline whose stages have different
    layer counts): the gate's job-wide combine needs every rank to check the same
    catalog slots at the same steps.
    """
    existing = _gates.get(engine)
    if existing is not None:
        return existing
    driver = session.replay
    if driver is None or not session.config.gate:
        return None
    catalog = gate_catalog(driver)
    config = session.config
    size = config.catalog_size if config.catalog_size is not None else len(catalog)
    if catalog and size > len(catalog):
        raise ConfigError(
            f"catalog_size K={size} exceeds the {len(catalog)} checks this job's replay can "
            "run; no recipe cycle could ever close"
        )
    group = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    shape = (size, [r.kind for r in catalog], sorted(driver.schedule.intervals.items()))
    try:
        _agree(shape, group, "the recipe catalog's shape")
    except CheckpointError:
        log.warning(
            "scout: the ranks' recipe catalogs differ in shape %s; DeepSpeed checkpoint "
            "gating is off (replay still runs)",
            shape,
        )
        return None
    if not catalog:
        return None
    gate = EngineGate(
        engine, session, driver, driver.writer, catalog=catalog, size=size, group=group
    )
    _gates[engine] = gate
    session.add_closer(gate.close)
    log.info(
        "scout: gating engine.save_checkpoint / load_checkpoint with a recipe cycle of K=%d", size
    )
    return gate


def recover(
    engine: Any, failure: Failure | str | None, *, load_dir: str | None = None, **kwargs: Any
) -> Recovered:
    """Load the DeepSpeed tag the checkpoint gate trusts after ``failure``. Collective.

    SDC (or a failure that is neither SDC nor slowness: no full-catalog sweep runs
    here, so it fails closed) → the newest *verified* tag; a straggler → the newest
    tag SCOUT does not suspect. ``load_dir`` adds that directory's sidecar (a fresh
    process). ``kwargs`` go to ``engine.load_checkpoint``. Returns
    ``Recovered(tag, step, role, reason)`` and writes a ``scout.checkpoint/1``
    retrieve record.
    """
    gate = _gates.get(engine)
    if gate is None:
        raise UnsupportedSetupError(
            "scout_deepspeed.recover needs SCOUT's checkpoint gate on this engine (an enabled "
            '"scout" section with replay and "gate": true)'
        )
    return gate.recover(failure, load_dir=load_dir, **kwargs)
