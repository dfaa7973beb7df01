"""The observers' rendezvous: their own store and their peer group's Gloo group, joined and left.

[Rendezvous: the observers' own store]
The observers meet through their own c10d ``TCPStore``, never the trainer's store or
communicator. It is served by the store host (:mod:`.store_host`), a process of its
own beside the lowest observed rank, at the address :mod:`.address` published. Each
observer compares notes with its *peer group* only (the equivalent ranks of
:mod:`.roles`; every observed rank when there is no layout): at start it registers
for its group, waits up to ``observer_join_timeout_s`` for the others, and forms one
Gloo group over those present (``init_process_group`` *in the observer process*, so
its default group is the observers', never training's, then one diagnostic group for
C3). An observer of the group that does not join in time is reported once, by the
lowest present one, as not having joined: a fact about the observer, not a failure
of its trainer.

A restarted observer (incarnation > 0) does not wait for its peers: it registers
its host and joins the next round, whose members include it.

When the store host's trainer closes, the host rings the bell with ``shutdown``
(:mod:`.store_host`), so the observers stop waiting instead of mistaking the end of
the job for a lost store. Each observer counts itself out in ``obs/closed``.
"""

from __future__ import annotations

import contextlib
import sys
import time

from scout_core.observer.core import CountedStore, ObserverBase
from scout_core.observer.fingerprint import install_collective_fingerprints
from scout_core.observer.record import STATE, ObserverState
from scout_core.records.evidence import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Mode, Scope, Status

__all__ = ["Rendezvous"]


class Rendezvous(ObserverBase):
    """Joining the observers' store and group, and leaving them."""

    def join(self) -> None:
        s = self.spec
        try:
            self.ops = CountedStore(self._connect(), self)
            self.bell = CountedStore(self._connect(), self)
            self.pg_store = self._connect()
            self.ops.set(f"obs/host/{s.rank}", self.hosts[s.rank])
        except (RuntimeError, OSError) as exc:
            self._set_state(ObserverState.FAILED)
            print(f"scout observer {s.rank}: cannot reach its store: {exc}", file=sys.stderr)
            return
        state = ObserverState.JOINED
        if s.incarnation == 0:
            started = time.monotonic()
            members = self.register(f"join/{self.gid}", started + s.join_timeout_s)
            present = [r for r, _ in members]
            if tuple(present) != self.peers:
                state = ObserverState.DEGRADED
                if s.rank == min(present):
                    self.writer.write(self._not_joined(present, time.monotonic() - started))
            if s.rank in present:
                self.ensure_group(members, "join")
        install_collective_fingerprints(self.collectives)  # count from here on
        self.counting = True
        self._set_state(state)

    def _not_joined(self, present: list[int], waited_s: float) -> Record:
        s = self.spec
        missing = tuple(r for r in self.peers if r not in present)
        return Record(
            schema=VERDICT_SCHEMA,
            run_id=s.run_id,
            step=0,
            surface="observer",
            mode=Mode.EXACT,
            status=Status.ATTRIBUTED,
            failure=None,
            group=self.peers,
            outliers=missing,
            scope=Scope.RANK,
            hosts=tuple("" for _ in missing),
            detail={
                "reason": f"the observers of ranks {list(missing)} did not join their peers "
                f"within {waited_s:.1f} s: those ranks are not compared until they do "
                "(their trainers are not blamed for it)",
                "present": present,
            },
        )

    def shutdown(self) -> None:
        if self.rec.observer_word(STATE) in (ObserverState.JOINED, ObserverState.DEGRADED):
            with contextlib.suppress(RuntimeError, OSError):
                self.ops.add("obs/closed", 1)
        self._set_state(ObserverState.EXITED)
