"""The trainer's handle on its observer: start it, watch it, restart it, close it.

Contract: an observer's death never counts as its trainer's failure. The trainer notices at
once (the control pipe reaches end-of-file) and starts a new observer on the same progress
record (*incarnation* + 1), which joins the next round; after :data:`MAX_RESTARTS` it stops
and logs that this rank's diagnosis is degraded. Docs: docs/observer.md, "A dead observer is
not a dead trainer".
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from scout_core.observer.escalation import ControlListener
from scout_core.observer.progress import (
    COLLS,
    PID,
    ROUNDS,
    STATE,
    STOREOPS,
    ObserverState,
    ProgressRecord,
    Publisher,
)
from scout_core.observer.spawn import Helper, spawn, spec_fd
from scout_core.observer.spec import ObserverSpec
from scout_core.observer.store_host import StoreHost
from scout_core.records.record import Record

__all__ = ["MAX_RESTARTS", "ObserverHandle", "ObserverStats"]

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Restarts of a dead observer before its rank's diagnosis is left degraded."""


@dataclass(frozen=True)
class ObserverStats:
    """What the observer reports about itself through the record (tests count these)."""

    state: ObserverState
    rounds: int
    collectives: int
    """torch.distributed collectives the observer issued after joining."""
    store_ops: int
    """Store requests it sent after joining (one posted round-signal wait when healthy)."""
    pid: int


class ObserverHandle:
    """The trainer's handle on its observer: the publisher, stats, verdicts, ``close``."""

    def __init__(
        self,
        spec: ObserverSpec,
        record: ProgressRecord,
        callbacks: Sequence[Callable[[Record], None]],
        *,
        host: StoreHost | None,
        undo_stacks: Callable[[], None] | None,
        close_timeout_s: float,
    ) -> None:
        self.record = record
        self.publisher = Publisher(record)
        self.host = host
        self.restarts = 0
        self.degraded = False
        """True once the observer died more often than it may be restarted."""
        self._spec = spec
        self._callbacks = list(callbacks)
        self._verdicts: list[Record] = []
        self._undo_stacks = undo_stacks
        self._close_timeout_s = close_timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._running = False
        self.proc: Helper
        self._listener: ControlListener
        self._launch()
        atexit.register(self.close)

    def _launch(self) -> None:
        control_r, control_w = os.pipe()
        spec = replace(self._spec, fds=(*self._spec.fds[:3], control_w))
        fd = spec_fd(spec.to_json())
        self.record.set_observer_word(STATE, int(ObserverState.STARTING))
        try:
            self.proc = spawn(
                ["-m", "scout_core.observer", "observe", str(fd)],
                (*self.record.fds(), control_w, fd),
            )
        finally:
            os.close(control_w)
            os.close(fd)
        proc = self.proc
        self._listener = ControlListener(
            control_r, self._callbacks, self._verdicts, on_exit=lambda: self._on_exit(proc)
        )

    def _on_exit(self, proc: Helper) -> None:
        """``proc``'s control pipe closed: it exited. Restart it unless closing."""
        try:
            code = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = None
        with self._lock:
            if self._closed or not self._running or proc is not self.proc:
                return  # closing, a failed start (start() reports it), or handled already
            rank = self._spec.rank
            if self.restarts >= MAX_RESTARTS:
                self.degraded = True
                log.error(
                    "the hang observer of rank %d exited (%s) after %d restarts; hang "
                    "diagnosis is degraded: rank %d is not compared, and never named for it",
                    rank,
                    code,
                    self.restarts,
                    rank,
                )
                return
            # the dead incarnation's JOINED must not read as the new one's
            self.record.set_observer_word(STATE, int(ObserverState.STARTING))
            self.restarts += 1
            log.warning(
                "the hang observer of rank %d (pid %d) exited (%s); restarting it "
                "(restart %d of %d)",
                rank,
                proc.pid,
                code,
                self.restarts,
                MAX_RESTARTS,
            )
            self._spec = replace(self._spec, incarnation=self._spec.incarnation + 1)
            self._launch()

    def running(self) -> None:
        """The start succeeded on every rank: from now on a dead observer is restarted."""
        with self._lock:
            self._running = True
        if self.proc.poll() is not None:  # it died during the start agreement
            self._on_exit(self.proc)

    def wait_joined(self, timeout_s: float) -> str | None:
        """Wait until the observer joined its peers; why it did not, or None."""
        deadline = time.monotonic() + timeout_s
        proc = self.proc
        while self.record.observer_word(STATE) == ObserverState.STARTING:
            if proc.poll() is not None:
                return f"its observer exited with {proc.returncode} before joining"
            if time.monotonic() > deadline:
                return f"its observer did not join within {timeout_s:g} s"
            time.sleep(0.01)
        if self.record.observer_word(STATE) == ObserverState.FAILED:
            return (
                f"its observer could not reach the observers' store at "
                f"{self._spec.store_addr}:{self._spec.store_port}"
            )
        return None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def store(self) -> tuple[str, int]:
        """Where the observers' store is: (address, port)."""
        return self._spec.store_addr, self._spec.store_port

    @property
    def verdicts(self) -> list[Record]:
        """Records this rank's observer handed to the trainer so far."""
        return list(self._verdicts)

    def stats(self) -> ObserverStats:
        w = self.record.observer_word
        return ObserverStats(ObserverState(w(STATE)), w(ROUNDS), w(COLLS), w(STOREOPS), w(PID))

    def abort(self) -> None:
        """Kill the observer and the store host now (a failed start). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._release()

    def close(self) -> None:
        """Stop the observer (and the store host, on the lowest rank). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self.publisher.mark_closing()
        try:
            self.proc.wait(timeout=self._close_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._release()

    def _release(self) -> None:
        """Close what outlives the observer process: listener, store host, stack dumps, record."""
        self._listener.join(1.0)
        if self.host is not None:
            self.host.close()
        if self._undo_stacks is not None:
            self._undo_stacks()
        self.record.close()
