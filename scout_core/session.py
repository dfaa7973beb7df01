"""A SCOUT session: the composition root of one job's replay, observer and gate.

Contract: :func:`compose` builds the parts around a framework adapter in order: the evidence
writer, the replay driver (the one step clock and its boundary events), the checkpoint gate, the
hang observer. Each part subscribes to what it needs and registers its own undo; the
:class:`Session` only holds them and delivers verdicts; ``close`` undoes in reverse, idempotently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TypeVar

from scout_core.checkpoint.attach import GateHandle, model_of
from scout_core.checkpoint.catalog import agreed_catalog
from scout_core.checkpoint.coordinator import CheckpointGate, Recovery
from scout_core.checkpoint.framework_gate import FrameworkGate
from scout_core.checkpoint.storage import check_storage
from scout_core.config import Config
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import UnsupportedSetupError
from scout_core.incident_merge import IncidentMerger
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.observer import ObserverHandle, checkpoint_stage, watch_dataloader
from scout_core.observer.attach import attach_observer
from scout_core.observer.elastic_error import write_error_file
from scout_core.records.evidence import EvidenceWriter
from scout_core.records.record import Record
from scout_core.records.runs import agree_run_id
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.topology.groups import PeerGroup, diagnostic_group
from scout_core.vocabulary import Failure

__all__ = ["VERDICTS_KEPT", "Session", "compose"]

log = logging.getLogger(__name__)
T = TypeVar("T")

VERDICTS_KEPT = 10_000
"""Verdicts a session keeps in :attr:`Session.verdicts` (the evidence files keep all)."""


class Session:
    """What ``enable`` returns: owns SCOUT's parts on one job until :meth:`close`."""

    def __init__(self, config: Config, *, callback: Callable[[Record], None] | None = None) -> None:
        self.config = config
        self.callback = callback
        self.verdicts: deque[Record] = deque(maxlen=VERDICTS_KEPT)
        """The verdicts this rank learned of, newest last (agreeing rounds are not recorded)."""
        self.incidents: deque[Record] = deque(maxlen=1)
        """The job's merged incidents, newest revision last; the same on every rank."""
        self.adapter: FrameworkAdapter | None = None
        self.replay: ReplayDriver | None = None
        self.observer: ObserverHandle | None = None
        """This rank's hang observer (None when ``Config.observer`` is off)."""
        self.checkpoints: CheckpointGate | None = None
        """The checkpoint gate (in-memory or the framework's own checkpoints); None when off."""
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []
        self._closed = False

    @property
    def enabled(self) -> bool:
        """Whether anything is attached (False for a disabled config)."""
        return self.replay is not None

    @property
    def step(self) -> int:
        """The current iteration (0-based): the replay driver's clock, read-only."""
        return 0 if self.replay is None else self.replay.step

    @property
    def peers(self) -> PeerGroup | None:
        """This rank's replay comparison group (None when SCOUT is disabled)."""
        return None if self.replay is None else self.replay.peers

    @property
    def gate(self) -> CheckpointGate | None:
        """The same as :attr:`checkpoints` (its earlier name)."""
        return self.checkpoints

    def add_closer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on :meth:`close` (last added, first run)."""
        self._closers.append(fn)

    def on_boundary(self, fn: Callable[[Boundary], None]) -> Callable[[], None]:
        """Call ``fn`` with every training iteration's :class:`Boundary` (step, recipes due,
        this rank's rounds) from now on; returns the remover. A no-op when disabled."""
        if self.replay is None:
            return lambda: None
        remove = self.replay.on_boundary(fn)
        self.add_closer(remove)
        return remove

    def close(self) -> None:
        """Detach everything; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        while self._closers:
            fn = self._closers.pop()
            try:
                fn()
            except Exception as exc:  # one failing closer must not keep the others open
                log.warning("error while closing: %s", exc)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def watch_dataloader(self, loader: Iterable[T]) -> Iterable[T]:
        """Wrap a DataLoader (any iterable) so the observer sees each fetch (``input_stall``);
        ``loader`` itself when the observer is off."""
        if self.observer is None:
            return loader
        return watch_dataloader(loader, self.observer.publisher)

    def checkpoint_stage(self, kind: str = "write") -> AbstractContextManager[None]:
        """Context watching a checkpoint write (or ``kind="read"``) for ``checkpoint_stall``."""
        if self.observer is None:
            return contextlib.nullcontext()
        return checkpoint_stage(self.observer.publisher, kind)

    def recover(
        self, failure: Failure | str | None, *, machines_accessible: bool = True
    ) -> Recovery:
        """Restore the checkpoint the gate trusts after ``failure`` (collective; paper Algorithm
        3; docs/checkpoint_gate.md, "Retrieval"). Returns what was restored, or the tag a
        framework's gate loaded; writes a checkpoint record."""
        if self.checkpoints is None:
            raise UnsupportedSetupError(
                "session.recover needs the checkpoint gate: it is off (Config.gate) or the "
                f"{self.adapter.name if self.adapter else 'disabled'} session has nothing to gate"
            )
        found = None if failure is None else Failure(failure)
        return self.checkpoints.recover(found, machines_accessible=machines_accessible)

    def resume(self) -> Recovery | None:
        """After a restart, restore the verified generation from ``checkpoint_dir`` (collective,
        once before the first step; in-memory gate). ``None`` if there is nothing to resume,
        else what was restored (training continues at ``step + 1``)."""
        if self.checkpoints is not None:
            return self.checkpoints.resume()
        raise UnsupportedSetupError(
            "session.resume needs the in-memory checkpoint gate with Config.checkpoint_dir; "
            "a framework's gate loads its own checkpoints (session.checkpoints.load(io))"
        )

    def emit(self, record: Record) -> None:
        """Hand one verdict to :attr:`verdicts` and the callback; locked, as replay (trainer
        thread) and the observer (listener thread) both deliver here."""
        with self._lock:
            self.verdicts.append(record)
            if self.callback is not None:
                self.callback(record)


def compose(
    adapter: FrameworkAdapter,
    config: Config,
    *,
    callback: Callable[[Record], None] | None = None,
    gates_checkpoints: bool = False,
    wire_checkpoints: Callable[[FrameworkGate], Callable[[], None]] | None = None,
) -> Session:
    """Start a session on ``adapter`` (collective); the ranks first agree on the run id and the
    storage check (a :class:`ConfigError` on every rank). ``gates_checkpoints`` (implied by
    ``wire_checkpoints``) picks :class:`FrameworkGate` over :class:`GateHandle`;
    ``wire_checkpoints(gate)`` routes the framework's checkpoints through it, returns the undo."""
    session = Session(config, callback=callback)
    if not config.enabled:
        adapter.close()
        return session
    try:
        _compose(session, adapter, config, gates_checkpoints, wire_checkpoints)
    except BaseException:
        if session.replay is None:  # else the driver's closer closes the adapter
            adapter.close()
        session.close()
        raise
    return session


def _compose(
    session: Session,
    adapter: FrameworkAdapter,
    config: Config,
    gates_checkpoints: bool,
    wire: Callable[[FrameworkGate], Callable[[], None]] | None,
) -> None:
    # One job-wide diagnostic group for what all ranks agree on: run id, storage, the gate.
    group = diagnostic_group()
    config = dataclasses.replace(config, run_id=agree_run_id(config, group))
    session.config = config  # every part below records under the agreed run id
    check_storage(config, group)
    writer = EvidenceWriter(config.report_dir, adapter.rank(), run_id=config.resolved_run_id())
    session.add_closer(writer.close)
    # The merger's and the gate's boundary words ride one reduction (scout_core.decision.vote).
    vote: BoundaryVote[Boundary] = BoundaryVote(group)
    merger = IncidentMerger(
        adapter.layout(),
        adapter.rank(),
        group=diagnostic_group(),
        writer=writer,
        run_id=config.resolved_run_id(),
        vote=vote,
    )
    session.incidents = merger.incidents

    def on_verdict(record: Record) -> None:
        merger.collect(record)
        session.emit(record)

    replay = ReplayDriver(adapter, config, writer, on_verdict=on_verdict)
    session.adapter = adapter
    session.replay = replay
    session.add_closer(replay.close)
    session.add_closer(replay.on_boundary(merger.on_boundary))
    if config.gate:
        session.checkpoints = _gate(
            session, replay, writer, vote, framework=gates_checkpoints, wire=wire
        )
    if config.observer:
        session.observer = attach_observer(
            adapter,
            config,
            on_verdict=session.emit,
            add_closer=session.add_closer,
            on_boundary=session.on_boundary,
        )


def _terminate_on_sdc(session: Session, step: int) -> None:
    """``on_sdc = "terminate"``: end every rank at once with torchelastic's error file and
    ``sdc_exit_code`` (records already flushed); the relaunch's ``resume()`` restores verified."""
    config = session.config
    named = [v for v in session.verdicts if v.outliers and v.failure is Failure.SDC][-8:]
    rank = session.adapter.rank() if session.adapter is not None else 0
    log.error("SDC at step %d: ending the job for a restart on verified state", step)
    write_error_file(named, rank, config.sdc_exit_code, why="on_sdc=terminate")
    logging.shutdown()
    os._exit(config.sdc_exit_code)


def _gate(
    session: Session,
    replay: ReplayDriver,
    writer: EvidenceWriter,
    vote: BoundaryVote[Boundary],
    *,
    framework: bool,
    wire: Callable[[FrameworkGate], Callable[[], None]] | None,
) -> CheckpointGate | None:
    """The checkpoint gate for this job (its combine rides ``vote``), or None, logged."""
    config, group = session.config, vote.group
    catalog = agreed_catalog(replay, config, group)
    if catalog is None:
        return None
    if framework or wire is not None:
        log.info("gating the %s framework's own checkpoints", replay.adapter.name)
        gated = FrameworkGate(replay, catalog, group=group, writer=writer, vote=vote)
        session.add_closer(gated.close)
        if wire is not None:
            session.add_closer(wire(gated))
        return gated
    model = model_of(replay.adapter)
    if model is None:
        log.warning(
            "the %s adapter exposes no model, so the checkpoint gate is off",
            replay.adapter.name,
        )
        return None
    gate = GateHandle(replay, catalog, model=model, group=group, writer=writer, vote=vote)
    session.add_closer(gate.close)
    if config.on_sdc == "terminate":
        gate.on_sdc = functools.partial(_terminate_on_sdc, session)
    return gate
