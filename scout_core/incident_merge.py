"""Where incidents are made: job-wide, at the replay boundary, on a diagnostic group.

Contract: :class:`IncidentMerger` collects this rank's verdict records; at each due boundary
one ``MAX`` word (a :class:`~scout_core.decision.vote.BoundaryVote` seat, or its own reduction)
asks whether any rank has some, and only then do they travel as JSON in one all-gather; all
ranks merge alike, the lowest writes the incidents (docs/evidence.md, "Where incidents are made").
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist

from scout_core.decision.agreement import any_flag, check_group
from scout_core.decision.vote import BoundaryVote
from scout_core.records.evidence import EvidenceWriter
from scout_core.records.incidents import IncidentBook, merge_window
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.replay.boundary import Boundary
from scout_core.topology.mesh import Axis, MeshLayout
from scout_core.vocabulary import Status

__all__ = ["INCIDENTS_KEPT", "IncidentMerger", "coupled_partners"]

log = logging.getLogger(__name__)

INCIDENTS_KEPT = 1000
"""Incidents a merger keeps in memory (the evidence files keep every one)."""
_MAX_PENDING = 512
"""Records one rank contributes to one window at most (a storm is counted, not sent)."""
_COUPLING = (Axis.S, Axis.T, Axis.C, Axis.E)


def coupled_partners(layout: MeshLayout) -> Callable[[int], frozenset[int]]:
    """Per rank, its FSDP shard, tensor, context and expert partners (data peers in a layer)."""
    axes = [a for a in _COUPLING if layout.size(a) > 1]
    cache: dict[int, frozenset[int]] = {}

    def partners(rank: int) -> frozenset[int]:
        if rank not in cache:
            found = {r for a in axes for r in layout.group_along(rank, (a,))}
            cache[rank] = frozenset(found - {rank})
        return cache[rank]

    return partners


def _gather_bytes(blob: bytes, group: dist.ProcessGroup) -> list[bytes]:
    """Every rank's ``blob``, in group rank order: sizes, then one padded all-gather."""
    size = dist.get_world_size(group)
    mine = torch.tensor([len(blob)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(sizes, mine, group=group)
    width = max(int(s.item()) for s in sizes)
    padded = torch.zeros(width, dtype=torch.uint8)
    if blob:
        padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    parts = [torch.zeros(width, dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(parts, padded, group=group)
    return [bytes(p[: int(n.item())].tolist()) for p, n in zip(parts, sizes, strict=True)]


class IncidentMerger:
    """Merges the job's verdict records into incidents at each replay boundary (module doc)."""

    def __init__(
        self,
        layout: MeshLayout,
        rank: int,
        *,
        group: dist.ProcessGroup,
        writer: EvidenceWriter,
        run_id: str,
        vote: BoundaryVote[Boundary] | None = None,
    ) -> None:
        self.group = check_group(group)  # a SCOUT group over the whole job
        self.rank = rank
        self.writer = writer
        self.partners = coupled_partners(layout)
        self.book = IncidentBook(run_id)
        self.incidents: deque[Record] = deque(maxlen=INCIDENTS_KEPT)
        """This run's incidents, newest revision last; the same on every rank."""
        self.dropped = 0
        """Records not sent because a window held more than ``_MAX_PENDING``."""
        self._pending: list[Record] = []
        self._writer_rank = min(layout.ranks)
        self._seat = None if vote is None else vote.seat("incident merger", 1, self._words)

    def _words(self, boundary: Boundary) -> list[int]:
        return [1 if self._pending else 0]

    def _any_pending(self, boundary: Boundary) -> bool:
        """Whether any rank collected records (one word of the boundary's reduction)."""
        if self._seat is None:
            return any_flag(bool(self._pending), self.group)
        found = self._seat.result(boundary)
        return found is not None and found[0] == 1

    def collect(self, record: Record) -> None:
        """Take a verdict delivered here. Of the judging group, its lowest member keeps it, and so
        does every rank outside it (whose lowest may not have judged it); duplicates merge by id."""
        if record.schema != VERDICT_SCHEMA:
            return
        if record.failure is None and record.status is not Status.INCONCLUSIVE:
            return  # an agreeing round: nothing to merge
        if record.group and self.rank in record.group and self.rank != min(record.group):
            return
        if len(self._pending) >= _MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(record)

    def on_boundary(self, boundary: Boundary) -> None:
        """Merge the window that ends at ``boundary`` (collective when recipes were due)."""
        if not boundary.due:
            return
        if not self._any_pending(boundary):
            return
        blob = json.dumps([r.to_dict() for r in self._pending], allow_nan=False).encode()
        self._pending.clear()
        window = [
            Record.from_dict(item)
            for part in _gather_bytes(blob, self.group)
            for item in json.loads(part)
        ]
        for incident in self.book.add(merge_window(window, self.partners)):
            self.incidents.append(incident)
            if self.rank == self._writer_rank:
                self.writer.write(incident)
                log.warning("incident: %s", incident.detail["summary"])
