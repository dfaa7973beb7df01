"""Evidence records: SCOUT's decisions, one JSON object per line, one file per rank.

Contract: every decision is a :class:`~scout_core.records.record.Record` appended to
``<report_dir>/<run>/rank-<rank>.jsonl`` with one ``os.write`` on an ``O_APPEND``
descriptor; a peer group's record is written once, by its lowest rank; a failed write is
logged, counted in :attr:`EvidenceWriter.dropped` and dropped, never raised into training.
Docs: docs/evidence.md, "Who writes what".
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from types import TracebackType

from scout_core.errors import EvidenceError
from scout_core.records.console import log_attribution
from scout_core.records.reading import RANK_FILE, ReadProblem, Report, load_report
from scout_core.records.record import (
    Record,
)
from scout_core.records.runs import run_directory

__all__ = [
    "RANK_FILE",
    "EvidenceWriter",
    "Report",
    "ReadProblem",
    "load_report",
]

log = logging.getLogger(__name__)
_LOG_EVERY = 1000


class EvidenceWriter:
    """Appends this rank's records to ``<report_dir>/<run>/rank-<rank>.jsonl``; thread-safe.
    The file opens on the first write, so a rank that decides nothing leaves none."""

    def __init__(
        self, report_dir: str | os.PathLike[str], rank: int, *, run_id: str, fsync: bool = True
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        if not run_id:
            raise ValueError("run_id must be a non-empty string")
        self.rank = rank
        self.run_id = run_id
        self.directory = Path(report_dir) / run_directory(run_id)
        """This run's directory (``<report_dir>/<run>``)."""
        self.path = self.directory / f"rank-{rank}.jsonl"
        # fsync also survives the machine going down, which is when evidence matters
        # most; records are rare (per decision, not per step), so its cost is small.
        self._fsync = fsync
        self._fd: int | None = None
        self._closed = False
        self._torn = False  # a write was cut short: the file ends inside a line
        self._lock = threading.Lock()
        self.written = 0
        self.dropped = 0
        """Records lost to I/O errors (a full or read-only ``report_dir``)."""
        self.last_error: OSError | None = None

    def write(self, record: Record) -> bool:
        """Append ``record``; True once written (fsynced if asked), False if an I/O error."""
        if record.run_id != self.run_id:
            raise EvidenceError(
                f"record run_id {record.run_id!r} does not match this writer's {self.run_id!r}"
            )
        data = (record.to_json() + "\n").encode("utf-8")
        log_attribution(record, self.rank)  # the console line, even if the disk fails
        with self._lock:
            if self._closed:
                raise ValueError(f"EvidenceWriter for {self.path} is closed")
            try:
                self._append(data)
            except OSError as exc:
                self._failed(exc)
                return False
            self.written += 1
            return True

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(b"\n" + data if self._torn else data)
        while view:
            written = os.write(self._fd, view)
            self._torn = True  # until the whole line is out
            view = view[written:]
        self._torn = False
        if self._fsync:
            os.fsync(self._fd)

    def _failed(self, exc: OSError) -> None:
        self.dropped += 1
        self.last_error = exc
        if self.dropped % _LOG_EVERY == 1 or _LOG_EVERY == 1:
            log.warning(
                "cannot write evidence to %s (%s); %d record(s) dropped so far, training goes on",
                self.path,
                exc.strerror or exc,
                self.dropped,
            )

    def write_group(self, record: Record) -> bool:
        """Write a group's record once, from its lowest global rank (which must be in the
        group); other members, and a write an I/O error dropped, return ``False``."""
        if self.rank not in record.group:
            raise EvidenceError(
                f"rank {self.rank} is not in the record's group {list(record.group)}"
            )
        if self.rank != min(record.group):
            return False
        return self.write(record)

    def close(self) -> None:
        """Close the file; later writes raise. Closing twice is harmless."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                with contextlib.suppress(OSError):  # a failed delayed write: nothing to do
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
