"""The observer process: one per rank, a CPU process outside the trainer that names hangs.

Started by :func:`scout_core.observer.start` as ``python -m scout_core.observer``
(a fresh interpreter: spawn, never fork) in its own session, so a signal to the
trainer's process group (``SIGSTOP``, Ctrl-Z) does not reach it. It dies with
its trainer: ``PR_SET_PDEATHSIG`` = ``SIGKILL``, plus a parent-pid check for a
trainer that died before the ``prctl``. It reads the trainer's progress record
(:mod:`.record`) and nothing else of the trainer.

[Rendezvous: the observers' own store]
The observers meet through their own c10d ``TCPStore``, never the trainer's
store or communicator. It is hosted by the observer of the lowest observed rank
(rank 0's observer), a separate process, so a frozen trainer 0 cannot freeze
it. Its address is ``Config.observer_addr``/``observer_port``; under torchrun
the defaults are ``MASTER_ADDR`` and ``MASTER_PORT + 1``
(:func:`~.spec.resolve_store`). The observers then form their own Gloo group
(``init_process_group`` *in the observer process*, so its default group is the
observers' world, not training's) and one diagnostic group made with
``new_group(backend="gloo")`` that C3 runs on.

[How silent observers meet: the doorbell]
Healthy training must cost the network nothing, yet every observer must join a
round within milliseconds once any of them suspects a hang. Each observer keeps
one blocking ``store.wait(["bell/<n>"])`` posted on a dedicated store
connection: the server holds it without polling, so a healthy run sends exactly
that one request per observer, whatever its length (a test counts it). An
observer whose rank stays silent past ``hang_timeout_s`` (``stage_timeout_s``
inside the DataLoader or checkpoint I/O) sets ``bell/<n>``; every waiter wakes,
and the round runs:

1. each observer snapshots its record and registers ``round/<n>/here/<rank>``;
2. after all registered, or ``observer_join_timeout_s``, the first observer to
   ``compare_set`` ``round/<n>/members`` fixes the membership for everyone;
3. with every observer present: one C3 AllGather on the diagnostic group and
   :func:`~.verdict.decide_round` on every observer; with some missing: those
   ranks are reported as unresponsive (their observer, so their trainer or
   their host, is gone), never silently dropped;
4. the lowest present rank writes the records; every observer hands them to
   its trainer (the user callback) and takes the ``on_hang`` action.

An observer's clock starts at its trainer's first publish: setting up a model
and its groups may legitimately take longer than any hang timeout. A round that
finds a rank still progressing produces nothing; the observer
that rang may ring again one timeout later. After a verdict nobody rings again
until its rank makes progress. When the trainer of the store host closes, its
observer rings the bell with ``shutdown`` and lingers briefly, so the others
stop waiting instead of mistaking the end of the job for a lost store.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# TCPStore and PrefixStore are public API (``torch.distributed.TCPStore``); torch's
# stubs only declare them in the C extension module, so import them from there.
from torch._C._distributed_c10d import PrefixStore, TCPStore

from scout_core.decision.c3 import Surface, exchange
from scout_core.observer.escalation import (
    STACK_SIGNAL,
    send_command,
    terminate_trainer,
    to_record,
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
    Stage,
)
from scout_core.observer.spec import ObserverSpec
from scout_core.observer.verdict import RankEvidence, Verdict, decide_round
from scout_core.records.evidence import VERDICT_SCHEMA, EvidenceWriter, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["main", "run"]

_PR_SET_PDEATHSIG = 1
_STALL_STAGES = frozenset({Stage.DATALOADER, Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE})
_BELL_WAIT = timedelta(hours=1)
_SHUTDOWN = "shutdown"
_SHUTDOWN_LINGER_S = 2.0


class _CollectiveCounter:
    """Counts every torch.distributed collective this process issues, into the record.

    Installed through the same patch as the trainer's fingerprints, so it sees what
    C3 really sends (``c3.exchange`` looks its AllGather up at call time).
    """

    def __init__(self, record: ProgressRecord) -> None:
        self.count = 0
        self._record = record

    def enter_collective(self, fp: Fingerprint) -> None:
        self.count += 1
        self._record.set_observer_word(COLLS, self.count)

    def exit_collective(self) -> None:
        pass


class _CountedStore:
    """A store connection whose every request is counted into the record once enabled."""

    def __init__(self, store: TCPStore, observer: Observer) -> None:
        self._store = store
        self._observer = observer

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        observer = self._observer

        def counted(*args: Any, **kwargs: Any) -> Any:
            observer.count_store_op()
            return attr(*args, **kwargs)

        return counted


class Observer:
    """One rank's observer: the watch loop (main thread) and the doorbell (a thread)."""

    def __init__(self, spec: ObserverSpec, record: ProgressRecord) -> None:
        self.spec = spec
        self.rec = record
        self.n = len(spec.ranks)
        self.index = spec.ranks.index(spec.rank)
        self.is_host = self.index == 0
        self.writer = EvidenceWriter(spec.report_dir, spec.rank, run_id=spec.run_id)
        self.hosts: dict[int, str] = {spec.rank: socket.gethostname()}
        self.lock = threading.Lock()
        self.collectives = _CollectiveCounter(record)
        self.store_ops = 0
        self.counting = False
        self.rounds = 0
        self.group: dist.ProcessGroup | None = None
        self.unresponsive: tuple[int, ...] = ()
        # progress, owned by the watch loop, read by the round under the lock
        self.last_op = -1
        self.quiet_since = time.monotonic()
        self.rang_at: float | None = None
        self.episode_verdict = False
        self.in_round = False
        self.over = False
        self.next_round = 1
        self.min_quiet_s = 0.5 * min(spec.hang_timeout_s, spec.stage_timeout_s)

    # -- store helpers -----------------------------------------------------------------

    def _connect(self, *, master: bool = False) -> TCPStore:
        s = self.spec
        return TCPStore(
            s.store_addr,
            s.store_port,
            None,
            master,
            timeout=timedelta(seconds=s.join_timeout_s),
            wait_for_workers=False,
        )

    def count_store_op(self) -> None:
        if self.counting:
            with self.lock:
                self.store_ops += 1
                self.rec.set_observer_word(STOREOPS, self.store_ops)

    def _set_state(self, state: ObserverState) -> None:
        self.rec.set_observer_word(STATE, int(state))

    # -- join --------------------------------------------------------------------------

    def join(self) -> None:
        s = self.spec
        try:
            self._host = self._connect(master=True) if self.is_host else None
            self.ops: Any = _CountedStore(self._connect(), self)
            self.bell: Any = _CountedStore(self._connect(), self)
            pg_store = self._connect()
        except (RuntimeError, OSError) as exc:
            self._set_state(ObserverState.FAILED)
            print(f"scout observer {s.rank}: cannot reach its store: {exc}", file=sys.stderr)
            return
        self.ops.set(f"obs/host/{s.rank}", self.hosts[s.rank])
        self.ops.add("obs/joined", 1)
        deadline = time.monotonic() + s.join_timeout_s
        while self.ops.add("obs/joined", 0) < self.n and time.monotonic() < deadline:
            time.sleep(0.02)
        members = self._agree("obs/members", deadline)
        for r in members:
            self.hosts[r] = self.ops.get(f"obs/host/{r}").decode()
        if members != s.ranks:
            self.unresponsive = tuple(r for r in s.ranks if r not in members)
            if s.rank == min(members):
                self.writer.write(self._unresponsive_record(members, "did not join", 0))
            self.counting = True
            self._set_state(ObserverState.DEGRADED)
            return
        dist.init_process_group(
            "gloo",
            store=PrefixStore("scout/observer/pg", pg_store),
            rank=self.index,
            world_size=self.n,
            timeout=timedelta(seconds=max(s.join_timeout_s, 5.0)),
        )
        self.group = dist.new_group(list(range(self.n)), backend="gloo")
        install_collective_fingerprints(self.collectives)  # count from here on
        self.counting = True
        self._set_state(ObserverState.JOINED)

    def _agree(self, key: str, deadline: float) -> tuple[int, ...]:
        """The members registered under ``key``'s prefix; first ``compare_set`` wins."""
        prefix = key.rsplit("/", 1)[0]
        count_key = f"{prefix}/count" if key.startswith("round/") else "obs/joined"
        here = "here" if key.startswith("round/") else "host"
        if self.ops.add(count_key, 0) >= self.n:
            present = self.spec.ranks
        else:
            present = tuple(r for r in self.spec.ranks if self.ops.check([f"{prefix}/{here}/{r}"]))
        del deadline
        value = self.ops.compare_set(key, "", ",".join(map(str, present)))
        return tuple(int(r) for r in value.decode().split(",") if r)

    def _unresponsive_record(self, members: Sequence[int], what: str, step: int) -> Record:
        missing = tuple(r for r in self.spec.ranks if r not in members)
        return Record(
            schema=VERDICT_SCHEMA,
            run_id=self.spec.run_id,
            step=step,
            surface="observer",
            mode=Mode.EXACT,
            status=Status.ATTRIBUTED,
            failure=None if what == "did not join" else Failure.HANG,
            group=self.spec.ranks,
            outliers=missing,
            scope=Scope.RANK,
            hosts=tuple(self.hosts.get(r, "") for r in missing),
            detail={
                "reason": f"the observers of ranks {list(missing)} {what} within "
                f"{self.spec.join_timeout_s:g} s: their trainer or host is gone or unreachable",
                "present": list(members),
            },
        )

    # -- watch -------------------------------------------------------------------------

    def watch(self) -> None:
        s = self.spec
        while True:
            snap = self.rec.read()
            now = time.monotonic()
            if snap.closing:
                return
            with self.lock:
                if snap.op_id != self.last_op:
                    self.last_op, self.quiet_since = snap.op_id, now
                    self.rang_at, self.episode_verdict = None, False
                quiet_since = self.quiet_since
            threshold = s.stage_timeout_s if snap.stage in _STALL_STAGES else s.hang_timeout_s
            due = quiet_since + threshold
            if snap.op_id == 0:
                # Nothing published yet: the trainer is still building its model and
                # groups, which may take any time. The clock starts at first progress
                # (a peer that did publish still rings for a rank stuck before it).
                self.rec.wait_for_progress(threshold)
                continue
            if now >= due:
                self._maybe_ring(now, threshold, snap.step)
                timeout = min(threshold, 0.5)
            else:
                timeout = due - now
            if self.rec.wait_for_progress(timeout):
                time.sleep(min(0.1, threshold / 20))  # bound the trainer's wake-ups

    def _maybe_ring(self, now: float, threshold: float, step: int) -> None:
        with self.lock:
            if self.in_round or self.episode_verdict or self.over:
                return
            if self.rang_at is not None and now - self.rang_at < threshold:
                return
            self.rang_at = now
            n = self.next_round
        if self.group is None:
            self._local_verdict(step)
            return
        with contextlib.suppress(RuntimeError, OSError):  # the doorbell reports a lost store
            self.ops.set(f"bell/{n}", str(self.spec.rank))

    def _local_verdict(self, step: int) -> None:
        """No group to compare with: say so, once per silent episode."""
        with self.lock:
            self.episode_verdict = True
        s = self.spec
        reason = (
            f"observers of ranks {list(self.unresponsive)} unresponsive"
            if self.unresponsive
            else "this observer could not reach its store"
        )
        self.writer.write(
            Record(
                schema=VERDICT_SCHEMA,
                run_id=s.run_id,
                step=step,
                surface="progress",
                mode=Mode.EXACT,
                status=Status.INCONCLUSIVE,
                failure=Failure.HANG,
                group=(s.rank,),
                scope=Scope.RANK,
                detail={
                    "reason": f"rank {s.rank} silent past its timeout; cannot compare: {reason}"
                },
            )
        )

    # -- doorbell and rounds -----------------------------------------------------------

    def doorbell(self) -> None:
        n = 1
        while True:
            key = f"bell/{n}"
            try:
                self.bell.wait([key], _BELL_WAIT)
                value = self.bell.get(key).decode()
            except dist.DistStoreError:
                continue  # the hour-long wait timed out: post it again
            except (RuntimeError, OSError):
                self._store_lost()
                return
            if value == _SHUTDOWN:  # the store host is closing: diagnosis is over
                with self.lock:
                    self.over = True
                return
            with self.lock:
                self.in_round = True
            try:
                self._round(n)
            except (RuntimeError, OSError) as exc:
                print(f"scout observer {self.spec.rank}: round {n} failed: {exc}", file=sys.stderr)
            finally:
                n += 1
                with self.lock:
                    self.in_round = False
                    self.next_round = n
                self.rounds += 1
                self.rec.set_observer_word(ROUNDS, self.rounds)

    def _round(self, n: int) -> None:
        s = self.spec
        snap = self.rec.read()
        with self.lock:
            quiet = 0.0 if snap.op_id != self.last_op else time.monotonic() - self.quiet_since
        prefix = f"round/{n}"
        self.ops.set(f"{prefix}/here/{s.rank}", "1")
        self.ops.add(f"{prefix}/count", 1)
        deadline = time.monotonic() + s.join_timeout_s
        while time.monotonic() < deadline:
            if self.ops.add(f"{prefix}/count", 0) >= self.n:
                break
            time.sleep(0.005)
        members = self._agree(f"{prefix}/members", deadline)
        if s.rank not in members:
            return
        if members != s.ranks:
            if s.rank == min(members):
                self.writer.write(self._unresponsive_record(members, "did not answer", snap.step))
            return
        assert self.group is not None
        results = exchange(
            [
                Surface("progress", Mode.EXACT, (snap.step, snap.op_id), width=2),
                Surface("collective", Mode.EXACT, snap.fingerprint, width=3),
                Surface("stage", Mode.EXACT, int(snap.stage)),
                Surface("quiet", Mode.STATISTICAL, quiet),
            ],
            group=self.group,
            ranks=list(range(self.n)),
        )
        evidence = []
        for i, r in enumerate(s.ranks):
            coord = results["progress"].evidence[i]
            fp = results["collective"].evidence[i]
            stage = results["stage"].evidence[i]
            q = results["quiet"].evidence[i]
            assert isinstance(coord, tuple) and isinstance(fp, tuple)
            assert isinstance(stage, int) and isinstance(q, float)
            evidence.append(RankEvidence(r, coord[0], coord[1], stage, (fp[0], fp[1], fp[2]), q))
        verdicts = decide_round(evidence, min_quiet_s=self.min_quiet_s, world_size=s.world_size)
        if verdicts:
            with self.lock:
                self.episode_verdict = True
            self._escalate(verdicts)

    def _escalate(self, verdicts: Sequence[Verdict]) -> None:
        s = self.spec
        control = s.fds[3]
        for v in verdicts:
            record = to_record(v, run_id=s.run_id, group=s.ranks, hosts=self.hosts)
            if s.rank == min(s.ranks):
                self.writer.write(record)
            send_command(control, {"verdict": record.to_dict()})
        localized = [v for v in verdicts if v.localized]
        if not localized:
            return
        if s.on_hang == "dump_stacks" and any(s.rank in v.outliers for v in localized):
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.trainer_pid, STACK_SIGNAL)
        elif s.on_hang == "terminate":
            terminate_trainer(control, s.trainer_pid, s.hang_exit_code)

    def _store_lost(self) -> None:
        with self.lock:
            self.over = True
        if self.rec.read().closing:
            return
        s = self.spec
        print(f"scout observer {s.rank}: lost the observers' store", file=sys.stderr)
        # One record, not one per rank: the second-lowest observer speaks for the rest.
        if self.n > 1 and s.rank == s.ranks[1]:
            self.writer.write(self._unresponsive_record(s.ranks[1:], "stopped answering", 0))

    # -- shutdown ----------------------------------------------------------------------

    def shutdown(self) -> None:
        s = self.spec
        if self.group is not None or self.rec.observer_word(STATE) == ObserverState.DEGRADED:
            try:
                self.ops.set(f"obs/closed/{s.rank}", "1")
                if self.is_host:
                    self.ops.set(f"bell/{self.next_round}", _SHUTDOWN)
                    deadline = time.monotonic() + _SHUTDOWN_LINGER_S
                    keys = [f"obs/closed/{r}" for r in s.ranks]
                    while time.monotonic() < deadline and not self.ops.check(keys):
                        time.sleep(0.05)
            except (RuntimeError, OSError):
                pass
        self._set_state(ObserverState.EXITED)


def _die_with_parent(trainer_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != trainer_pid:  # the trainer died before prctl took effect
        os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m scout_core.observer '<spec json>'``."""
    args = list(sys.argv[1:] if argv is None else argv)
    spec = ObserverSpec.from_json(args[0])
    _die_with_parent(spec.trainer_pid)
    mem, ev_r, ev_w, _control = spec.fds
    record = ProgressRecord.attach(mem, ev_r, ev_w)
    record.set_observer_word(PID, os.getpid())
    observer = Observer(spec, record)
    observer.join()
    if observer.group is not None:
        threading.Thread(target=observer.doorbell, name="scout-doorbell", daemon=True).start()
    observer.watch()
    observer.shutdown()
    return 0


def run() -> None:
    """Run :func:`main` and exit without joining the doorbell thread."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the doorbell thread sits in a blocking store call: do not join it
