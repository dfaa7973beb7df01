"""Evidence records: SCOUT's decisions, one JSON object per line, one file per rank.

Every decision SCOUT makes (a C3 verdict on a replay surface, a hang diagnosis, a
checkpoint-gate transition, an incident) becomes a :class:`Record` appended to
``<report_dir>/rank-<global rank>.jsonl``. A peer group's record is written once, by
the group's lowest global rank (:meth:`EvidenceWriter.write_group`), so a report
holds each decision exactly once however large the group. An external recovery
policy, ``scout report`` and the tests read the directory back with
:func:`load_report`.

This module is the one place to import evidence from: the record and its schemas
(:mod:`scout_core.records.record`), the writer (here) and the reader
(:mod:`scout_core.records.reading`). ``docs/evidence.md`` describes every field.

Writes use one ``os.write`` on an ``O_APPEND`` descriptor per record: nothing waits
in a user-space buffer, so a record survives the process dying right after
``write`` returns, and two writers of the same file (a trainer thread and the
observer path) cannot interleave inside a line.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

from scout_core.errors import EvidenceError
from scout_core.records.console import log_attribution
from scout_core.records.reading import RANK_FILE, ReadProblem, Report, load_report
from scout_core.records.record import (
    ACTIONS,
    CHECKPOINT_SCHEMA,
    ID_LENGTH,
    INCIDENT_SCHEMA,
    SCHEMAS,
    SELECTIONS,
    VERDICT_SCHEMA,
    Record,
)

__all__ = [
    "VERDICT_SCHEMA",
    "CHECKPOINT_SCHEMA",
    "INCIDENT_SCHEMA",
    "SCHEMAS",
    "ACTIONS",
    "SELECTIONS",
    "ID_LENGTH",
    "RANK_FILE",
    "Record",
    "EvidenceWriter",
    "Report",
    "ReadProblem",
    "load_report",
]

# -- writing ----------------------------------------------------------------------------


class EvidenceWriter:
    """Appends this rank's records to ``<report_dir>/rank-<rank>.jsonl``.

    Thread-safe. The file is opened on the first write, so a rank that decides
    nothing leaves no file. Each record is one ``os.write`` (and, with ``fsync``,
    an ``os.fsync``) before ``write`` returns.
    """

    def __init__(
        self, report_dir: str | os.PathLike[str], rank: int, *, run_id: str, fsync: bool = True
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        if not run_id:
            raise ValueError("run_id must be a non-empty string")
        self.rank = rank
        self.run_id = run_id
        self.path = Path(report_dir) / f"rank-{rank}.jsonl"
        # fsync also survives the machine going down, which is when evidence matters
        # most; records are rare (per decision, not per step), so its cost is small.
        self._fsync = fsync
        self._fd: int | None = None
        self._closed = False
        self._lock = threading.Lock()

    def write(self, record: Record) -> None:
        """Append ``record`` as one line; it is on disk (or at least in the OS) on return."""
        if record.run_id != self.run_id:
            raise EvidenceError(
                f"record run_id {record.run_id!r} does not match this writer's {self.run_id!r}"
            )
        data = (record.to_json() + "\n").encode("utf-8")
        with self._lock:
            if self._closed:
                raise ValueError(f"EvidenceWriter for {self.path} is closed")
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self._fsync:
                os.fsync(self._fd)
        log_attribution(record, self.rank)

    def write_group(self, record: Record) -> bool:
        """Write a group's record if this rank is the group's lowest global rank.

        A group's record is written once, by its lowest global rank; every other
        member returns ``False`` without writing. The record must name a group that
        contains this rank.
        """
        if self.rank not in record.group:
            raise EvidenceError(
                f"rank {self.rank} is not in the record's group {list(record.group)}"
            )
        if self.rank != min(record.group):
            return False
        self.write(record)
        return True

    def close(self) -> None:
        """Close the file; later writes raise. Closing twice is harmless."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> EvidenceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
