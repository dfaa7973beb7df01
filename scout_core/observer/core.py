"""One observer's shared state and the store vocabulary its parts speak.

Contract: :class:`ObserverBase` holds what the rendezvous, the silence watch and the
diagnosis round share; a group's members are fixed by the first ``compare_set``, and its
process group is rebuilt only when they change. Docs: docs/observer.md, "Inside one
observer".
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# Public in torch.distributed, but torch's stubs declare them only here.
from torch._C._distributed_c10d import PrefixStore, TCPStore

from scout_core.observer.fingerprint import Fingerprint
from scout_core.observer.progress import COLLS, STATE, STOREOPS, ObserverState, ProgressRecord
from scout_core.observer.spec import ObserverSpec, layout_from_json
from scout_core.records.evidence import EvidenceWriter
from scout_core.topology.groups import diagnostic_group

__all__ = ["CollectiveCounter", "CountedStore", "Members", "ObserverBase"]

Members = tuple[tuple[int, int], ...]
"""Agreed members of a group: ``(rank, incarnation)``, ascending by rank."""


class CollectiveCounter:
    """Counts every torch.distributed collective this process issues, into the record.

    Installed through the fingerprint patch: ``c3.exchange`` looks its AllGather up per call."""

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
    """The counted store connection the round listener waits on (set by the rendezvous)."""
    pg_store: Any
    """A store connection for the Gloo groups' own rendezvous (set by the rendezvous)."""

    def __init__(self, spec: ObserverSpec, record: ProgressRecord) -> None:
        self.spec = spec
        self.rec = record
        self.layout = layout_from_json(spec.layout)
        self.peers = spec.peers
        self.gid = min(spec.peers)
        """The group's id in store keys: its lowest rank."""
        self.writer = EvidenceWriter(spec.report_dir, spec.rank, run_id=spec.run_id)
        self.hosts: dict[int, str] = {spec.rank: socket.gethostname()}
        self.lock = threading.Lock()
        self.collectives = CollectiveCounter(record)
        self.store_ops = 0
        self.counting = False
        self.rounds = 0
        self.group: dist.ProcessGroup | None = None
        """The Gloo group over ``members`` (rebuilt when they change)."""
        self.members: Members = ()
        # progress, owned by the watch loop, read by the round under the lock
        self.last_op = -1
        self.quiet_since = time.monotonic()
        self.rang_at: float | None = None
        self.start_step: int | None = None
        """The step of this rank's first publish (the watch loop's start-up rule)."""
        self.episode_verdict = False
        """A verdict came while this rank was silent: no new attribution until it progresses
        (the job is being torn down, or recovered)."""
        self.in_round = False
        self.over = False
        self.next_round = 1
        self.store_lost_at: float | None = None
        self.min_quiet_s = 0.5 * min(spec.hang_timeout_s, spec.stage_timeout_s)

    def _connect(self) -> TCPStore:
        s = self.spec
        return TCPStore(
            s.store_addr,
            s.store_port,
            None,
            False,
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

    def observed_ranks(self) -> tuple[int, ...]:
        """Every observed rank of the job, ascending."""
        return self.layout.ranks if self.layout is not None else self.peers

    def host_of(self, rank: int) -> str:
        """The host name ``rank``'s observer registered ("" if none, or the store is gone)."""
        if rank not in self.hosts:
            key = f"obs/host/{rank}"
            try:
                self.hosts[rank] = self.ops.get(key).decode() if self.ops.check([key]) else ""
            except (RuntimeError, OSError):  # the store is gone: the verdict still goes out
                return ""
        return self.hosts[rank]

    def register(self, prefix: str, deadline: float) -> Members:
        """Register under ``prefix``, wait for the group (or ``deadline``), agree on members."""
        s = self.spec
        self.ops.append(f"{prefix}/list", f"{s.rank}.{s.incarnation},")
        self.ops.add(f"{prefix}/count", 1)
        while self.ops.add(f"{prefix}/count", 0) < len(self.peers):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        listed = self.ops.get(f"{prefix}/list").decode()
        found: dict[int, int] = {}
        for item in listed.split(","):
            if item:
                r, inc = item.split(".")
                found[int(r)] = max(int(inc), found.get(int(r), -1))
        text = ",".join(f"{r}.{found[r]}" for r in sorted(found))
        agreed = self.ops.compare_set(f"{prefix}/members", "", text).decode()
        members = []
        for item in agreed.split(","):
            r, inc = item.split(".")
            members.append((int(r), int(inc)))
        return tuple(members)

    def ensure_group(self, members: Members, tag: str) -> None:
        """Make :attr:`group` a Gloo group over ``members`` (kept while they are unchanged).

        Collective over ``members``, with the same ``tag`` (the round, which names the keys)."""
        if members == self.members and self.group is not None:
            return
        if dist.is_initialized():
            dist.destroy_process_group()
            self.group = None
        ranks = [r for r, _ in members]
        dist.init_process_group(
            "gloo",
            store=PrefixStore(f"pg/{self.gid}/{tag}", self.pg_store),
            rank=ranks.index(self.spec.rank),
            world_size=len(ranks),
            timeout=timedelta(seconds=max(self.spec.join_timeout_s, 5.0)),
        )
        self.group = diagnostic_group(range(len(ranks)))
        self.members = members
