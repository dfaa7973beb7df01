"""One observer's shared state and the store vocabulary its parts speak.

The observer process (:mod:`.process`) is three parts over one state: the
rendezvous (:mod:`.rendezvous`: joining the observers' store and Gloo group, and
leaving it), the silence watch (:mod:`.watch`: ringing the doorbell when this rank
stops progressing) and the diagnosis round (:mod:`.diagnosis_round`: the C3 round
every observer joins when the bell rings). :class:`ObserverBase` holds what they
share: the spec, the progress record, the evidence writer, the lock-protected watch
state, the store connections, and how membership is agreed and reported.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# TCPStore is public API (``torch.distributed.TCPStore``); torch's stubs only declare
# it in the C extension module, so import it from there.
from torch._C._distributed_c10d import TCPStore

from scout_core.observer.fingerprint import Fingerprint
from scout_core.observer.record import COLLS, STATE, STOREOPS, ObserverState, ProgressRecord
from scout_core.observer.spec import ObserverSpec
from scout_core.records.evidence import VERDICT_SCHEMA, EvidenceWriter, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["CollectiveCounter", "CountedStore", "ObserverBase"]


class CollectiveCounter:
    """Counts every torch.distributed collective this process issues, into the record.

    Installed through the same patch as the trainer's fingerprints, so it sees what
    C3 really sends (``c3.exchange`` looks its AllGather up at call time).
    """

    def __init__(self, record: ProgressRecord) -> None:
        self.count = 0
        self._record = record

    def enter_collective(self, fp: Fingerprint, peer: int | None = None) -> None:
        self.count += 1
        self._record.set_observer_word(COLLS, self.count)

    def exit_collective(self) -> None:
        pass


class CountedStore:
    """A store connection whose every request is counted into the record once enabled."""

    def __init__(self, store: TCPStore, observer: ObserverBase) -> None:
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


class ObserverBase:
    """What the observer's parts share (see the module doc); :class:`~.process.Observer`."""

    ops: Any
    """The counted store connection for requests (set by the rendezvous)."""
    bell: Any
    """The counted store connection the doorbell waits on (set by the rendezvous)."""

    def __init__(self, spec: ObserverSpec, record: ProgressRecord) -> None:
        self.spec = spec
        self.rec = record
        self.n = len(spec.ranks)
        self.index = spec.ranks.index(spec.rank)
        self.is_host = self.index == 0
        self.writer = EvidenceWriter(spec.report_dir, spec.rank, run_id=spec.run_id)
        self.hosts: dict[int, str] = {spec.rank: socket.gethostname()}
        self.lock = threading.Lock()
        self.collectives = CollectiveCounter(record)
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
