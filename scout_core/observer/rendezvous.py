"""The observers' rendezvous: their own store and Gloo group, joined and left.

[Rendezvous: the observers' own store]
The observers meet through their own c10d ``TCPStore``, never the trainer's
store or communicator. It is hosted by the observer of the lowest observed rank
(rank 0's observer), a separate process, so a frozen trainer 0 cannot freeze
it. Its address is ``Config.observer_addr``/``observer_port``; under torchrun
the defaults are ``MASTER_ADDR`` and ``MASTER_PORT + 1``
(:func:`~.spec.resolve_store`). The observers then form their own Gloo group
(``init_process_group`` *in the observer process*, so its default group is the
observers' world, not training's) and one diagnostic group that C3 runs on. An
observer that cannot join in ``observer_join_timeout_s`` is reported as
unresponsive by the lowest present one, never silently dropped.

When the trainer of the store host closes, its observer rings the bell with
``shutdown`` and lingers briefly (:meth:`Rendezvous.shutdown`), so the others stop
waiting instead of mistaking the end of the job for a lost store.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch.distributed as dist

# PrefixStore is public API (``torch.distributed.PrefixStore``); torch's stubs only
# declare it in the C extension module, so import it from there.
from torch._C._distributed_c10d import PrefixStore

from scout_core.observer.core import CountedStore, ObserverBase
from scout_core.observer.fingerprint import install_collective_fingerprints
from scout_core.observer.record import STATE, ObserverState
from scout_core.topology.groups import diagnostic_group

__all__ = ["SHUTDOWN", "Rendezvous"]

SHUTDOWN = "shutdown"
"""The bell value the store host rings when its trainer closes."""
_SHUTDOWN_LINGER_S = 2.0


class Rendezvous(ObserverBase):
    """Joining the observers' store and group, and leaving them."""

    def join(self) -> None:
        s = self.spec
        try:
            self._host = self._connect(master=True) if self.is_host else None
            self.ops = CountedStore(self._connect(), self)
            self.bell = CountedStore(self._connect(), self)
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
        self.group = diagnostic_group(range(self.n))
        install_collective_fingerprints(self.collectives)  # count from here on
        self.counting = True
        self._set_state(ObserverState.JOINED)

    def shutdown(self) -> None:
        s = self.spec
        if self.group is not None or self.rec.observer_word(STATE) == ObserverState.DEGRADED:
            try:
                self.ops.set(f"obs/closed/{s.rank}", "1")
                if self.is_host:
                    self.ops.set(f"bell/{self.next_round}", SHUTDOWN)
                    deadline = time.monotonic() + _SHUTDOWN_LINGER_S
                    keys = [f"obs/closed/{r}" for r in s.ranks]
                    while time.monotonic() < deadline and not self.ops.check(keys):
                        time.sleep(0.05)
            except (RuntimeError, OSError):
                pass
        self._set_state(ObserverState.EXITED)
