"""The diagnosis round: every observer compares notes with C3 when the bell rings.

1. each observer snapshots its record and registers ``round/<n>/here/<rank>``;
2. after all registered, or ``observer_join_timeout_s``, the first observer to
   ``compare_set`` ``round/<n>/members`` fixes the membership for everyone;
3. with every observer present: one C3 AllGather on the diagnostic group and
   :func:`~.verdict.decide_round` on every observer; with some missing: those
   ranks are reported as unresponsive (their observer, so their trainer or
   their host, is gone), never silently dropped;
4. the lowest present rank writes the records; every observer hands them to
   its trainer (the user callback) and takes the ``on_hang`` action.

A round that finds a rank still progressing produces nothing. The doorbell thread
keeps one blocking ``store.wait`` posted, so a healthy run sends exactly one
request per observer, whatever its length.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from scout_core.decision.c3 import Surface, exchange
from scout_core.observer.core import ObserverBase
from scout_core.observer.escalation import STACK_SIGNAL, send_command, terminate_trainer, to_record
from scout_core.observer.record import ROUNDS
from scout_core.observer.rendezvous import SHUTDOWN
from scout_core.observer.verdict import RankEvidence, Verdict, decide_round
from scout_core.vocabulary import Mode

__all__ = ["DiagnosisRound"]

_BELL_WAIT = timedelta(hours=1)


class DiagnosisRound(ObserverBase):
    """The doorbell thread and the round it runs."""

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
            if value == SHUTDOWN:  # the store host is closing: diagnosis is over
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
