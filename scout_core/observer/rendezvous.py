"""The observers' rendezvous: their own store and their peer group's Gloo group, joined and left.

Contract: observers meet only through their own ``TCPStore``, never the trainer's store or
communicator; each forms one Gloo group over the present members of its peer group. An
observer that does not join in time is reported once; a restarted one joins the next round.
Docs: docs/observer.md, "Inside one observer".
"""

from __future__ import annotations

import contextlib
import sys
import time

from scout_core.observer.core import CountedStore, ObserverBase
from scout_core.observer.fingerprint import install_collective_fingerprints
from scout_core.observer.progress import STATE, ObserverState
from scout_core.records.record import VERDICT_SCHEMA, Record
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
