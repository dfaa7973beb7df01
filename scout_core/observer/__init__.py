"""The out-of-band hang observer (paper §7): name the rank behind a hang, in another process.

A trainer that hangs cannot report its own hang, and a frozen process freezes
all of its threads. So each rank's trainer only *publishes* cheap progress into
a shared-memory record (:mod:`.record`), via collective fingerprints
(:mod:`.fingerprint`) and stage hooks (:mod:`.stages`), and a separate CPU
process per rank (:mod:`.process`) watches it. When progress stays silent past
``Config.hang_timeout_s`` the observers compare notes with C3 on their own Gloo
group and decide (:mod:`.verdict`): ``hang``, ``protocol_mismatch``,
``group_stall``, ``input_stall`` or ``checkpoint_stall``. Verdicts become
evidence records, reach a user callback and may trigger an action
(:mod:`.escalation`). Healthy training exchanges nothing.

Typical use (``scout.enable`` does this)::

    handle = observer.start(config, rank=rank, world_size=world)
    close_patch = observer.install_collective_fingerprints(handle.publisher)
    close_hooks = observer.attach_progress_hooks(handle.publisher, layers, [optimizer])
    loader = observer.watch_dataloader(loader, handle.publisher)
    ...
    close_hooks(); close_patch(); handle.close()
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scout_core.config import Config
from scout_core.errors import ScoutError
from scout_core.observer.escalation import (
    STACK_SIGNAL,
    VERDICT_MARGIN_S,
    ControlListener,
    check_watchdog,
    install_stack_dump,
)
from scout_core.observer.fingerprint import Fingerprint, install_collective_fingerprints
from scout_core.observer.record import (
    COLLS,
    PID,
    ROUNDS,
    STATE,
    STOREOPS,
    ObserverState,
    ProgressRecord,
    Publisher,
    Stage,
)
from scout_core.observer.spec import ObserverSpec, resolve_store
from scout_core.observer.stages import (
    attach_progress_hooks,
    checkpoint_stage,
    watch_dataloader,
)
from scout_core.observer.verdict import Verdict
from scout_core.records.evidence import Record

__all__ = [
    "STACK_SIGNAL",
    "VERDICT_MARGIN_S",
    "Fingerprint",
    "ObserverHandle",
    "ObserverState",
    "ObserverStats",
    "Publisher",
    "Stage",
    "Verdict",
    "attach_progress_hooks",
    "check_watchdog",
    "checkpoint_stage",
    "install_collective_fingerprints",
    "resolve_store",
    "start",
    "watch_dataloader",
]

_START_SLACK_S = 30.0  # interpreter + torch import of the observer on a loaded machine


@dataclass(frozen=True)
class ObserverStats:
    """What the observer reports about itself through the record (tests count these)."""

    state: ObserverState
    rounds: int
    collectives: int
    """torch.distributed collectives the observer issued after joining."""
    store_ops: int
    """Store requests it sent after joining (one posted doorbell wait when healthy)."""
    pid: int


class ObserverHandle:
    """The trainer's handle on its observer: the publisher, stats, verdicts, ``close``."""

    def __init__(
        self,
        record: ProgressRecord,
        proc: subprocess.Popen[bytes],
        listener: ControlListener,
        undo_stacks: Callable[[], None] | None,
        close_timeout_s: float,
    ) -> None:
        self.record = record
        self.publisher = Publisher(record)
        self.proc = proc
        self._listener = listener
        self._undo_stacks = undo_stacks
        self._close_timeout_s = close_timeout_s
        self._closed = False
        atexit.register(self.close)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def verdicts(self) -> list[Record]:
        """Records this rank's observer handed to the trainer so far."""
        return list(self._listener.verdicts)

    def stats(self) -> ObserverStats:
        w = self.record.observer_word
        return ObserverStats(ObserverState(w(STATE)), w(ROUNDS), w(COLLS), w(STOREOPS), w(PID))

    def close(self) -> None:
        """Stop the observer (it lingers briefly if it hosts the store). Idempotent."""
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
        self._listener.join(1.0)
        if self._undo_stacks is not None:
            self._undo_stacks()
        self.record.close()


def start(
    config: Config,
    *,
    rank: int,
    world_size: int,
    ranks: Sequence[int] | None = None,
    on_verdict: Callable[[Record], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ObserverHandle:
    """Spawn this rank's observer and wait until it has joined its peers.

    ``ranks`` are the observed global ranks (all of ``world_size`` by default);
    every one of them must call ``start`` with the same list. ``on_verdict`` runs
    on a trainer thread for every verdict record of this rank's group. Raises
    :class:`~scout_core.errors.ScoutError` if the observer dies before joining;
    peers whose observers never join are reported in evidence, not raised.
    """
    observed = tuple(range(world_size) if ranks is None else sorted(ranks))
    if rank not in observed:
        raise ValueError(f"rank {rank} is not among the observed ranks {list(observed)}")
    addr, port = resolve_store(config, environ)
    record = ProgressRecord.create()
    control_r, control_w = os.pipe()
    spec = ObserverSpec(
        rank=rank,
        ranks=observed,
        world_size=world_size,
        store_addr=addr,
        store_port=port,
        trainer_pid=os.getpid(),
        fds=(record.mem_fd, record.event_r, record.event_w, control_w),
        hang_timeout_s=config.hang_timeout_s,
        stage_timeout_s=config.resolved_stage_timeout_s(),
        join_timeout_s=config.observer_join_timeout_s,
        on_hang=config.on_hang,
        hang_exit_code=config.hang_exit_code,
        report_dir=config.report_dir,
        run_id=config.resolved_run_id(environ),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "scout_core.observer", spec.to_json()],
        pass_fds=(*record.fds(), control_w),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(control_w)
    listener = ControlListener(control_r, [on_verdict] if on_verdict else [])
    undo = install_stack_dump(config.report_dir, rank) if config.on_hang == "dump_stacks" else None
    deadline = time.monotonic() + config.observer_join_timeout_s + _START_SLACK_S
    while record.observer_word(STATE) == ObserverState.STARTING:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            if undo is not None:
                undo()
            record.close()
            raise ScoutError(
                f"the hang observer of rank {rank} exited with {proc.returncode} before "
                f"joining its peers at {addr}:{port}"
            )
        time.sleep(0.01)
    return ObserverHandle(
        record, proc, listener, undo, close_timeout_s=config.observer_join_timeout_s + 5.0
    )
