"""Reading a report back: a directory of rank files, or one file, strictly or leniently.

Contract: :func:`load_report` reads every ``rank-<global rank>.jsonl`` of a report
directory and its run subdirectories (or a single file) into a :class:`Report`. Strict
(the default) raises :class:`EvidenceError` at the first problem, naming file and line;
lenient (``scout report``) skips and lists each bad line or file in :attr:`Report.problems`.
Only regular files are opened (``stat``, ``O_NONBLOCK``, ``fstat``), so a FIFO cannot hang
the reader; ``rank-01.jsonl`` is not rank 1's file. Docs: docs/evidence.md.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from scout_core.errors import EvidenceError
from scout_core.records.record import CHECKPOINT_SCHEMA, INCIDENT_SCHEMA, VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Status

__all__ = ["RANK_FILE", "ReadProblem", "Report", "load_report"]

RANK_FILE = re.compile(r"^rank-(0|[1-9][0-9]*)\.jsonl$")
"""The name a writer gives rank ``r``'s file: ``rank-<r>.jsonl``, no leading zeros."""

_NUMBERED = re.compile(r"^rank-([0-9]+)\.jsonl$")
_Problem = Callable[[Path, "int | None", str], None]  # load_report's ``problem``
_MAX_LINE = 64 << 20  # a record of a 100k-rank group's timings is well under 8 MiB
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True)
class ReadProblem:
    """Something :func:`load_report` could not read, and skipped (lenient mode)."""

    path: str
    line: int | None
    """1-based line number, or ``None`` when the whole file was skipped."""
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class Report:
    """All records of one report directory (or one file)."""

    directory: Path
    """The directory read, or the directory holding the file read."""
    records: tuple[Record, ...]
    """Every record, sorted by time, then by the rank whose file holds it."""
    by_rank: Mapping[int, tuple[Record, ...]]
    """Records per writing rank, in file order (runs one after another)."""
    files: tuple[Path, ...] = ()
    """The files records were read from (wholly or in part)."""
    problems: tuple[ReadProblem, ...] = ()
    """What was skipped, in reading order (always empty from a strict read)."""

    def verdicts(self, failure: Failure | str | None = None) -> tuple[Record, ...]:
        """``scout.verdict/1`` records, only those reporting ``failure`` when given."""
        wanted = None if failure is None else Failure(failure)
        return tuple(
            r
            for r in self.records
            if r.schema == VERDICT_SCHEMA and (wanted is None or r.failure is wanted)
        )

    def attributed(self) -> tuple[Record, ...]:
        """Verdicts that name outlier ranks."""
        return tuple(r for r in self.verdicts() if r.status is Status.ATTRIBUTED)

    def checkpoints(self) -> tuple[Record, ...]:
        """``scout.checkpoint/1`` records."""
        return tuple(r for r in self.records if r.schema == CHECKPOINT_SCHEMA)

    def incidents(self) -> tuple[Record, ...]:
        """``scout.incident/1`` records, the newest revision of each ``detail.key`` per run
        (:mod:`scout_core.records.incidents`), in time order; :attr:`records` holds them all."""
        newest: dict[tuple[str, str], Record] = {}
        for r in self.records:
            if r.schema == INCIDENT_SCHEMA:
                key = r.detail.get("key")
                newest[(r.run_id, key if isinstance(key, str) else r.id)] = r
        return tuple(sorted(newest.values(), key=lambda r: r.time))

    def runs(self) -> tuple[str, ...]:
        """The run ids present, in order of each run's first record."""
        return tuple(dict.fromkeys(r.run_id for r in self.records))

    def ranks_without_file(self) -> tuple[int, ...]:
        """Ranks that records name (in a group) with no readable file here: not necessarily
        missing, since only a group's lowest rank writes its record."""
        named = {r for record in self.records for r in record.group}
        return tuple(sorted(named - set(self.by_rank)))


def load_report(report_dir: str | os.PathLike[str], *, strict: bool = True) -> Report:
    """Read every ``rank-<r>.jsonl`` under ``report_dir``, or the one file it names.

    ``report_dir`` may hold several runs (a subdirectory each), be one run's directory, or
    hold rank files at its top (older reports). ``strict``: module doc. A directory without
    rank files gives an empty report; a path that is neither a directory nor a file is an error.
    """
    path = Path(report_dir)
    problems: list[ReadProblem] = []

    def problem(where: Path, line: int | None, message: str) -> None:
        found = ReadProblem(str(where), line, message)
        if strict:
            raise EvidenceError(str(found))
        problems.append(found)

    if path.is_dir():
        directory, candidates = path, _rank_files(path, problem)
        for run in _run_dirs(path):  # <report_dir>/<run>/rank-<r>.jsonl
            candidates += _rank_files(run, problem)
    elif path.is_file():
        match = RANK_FILE.match(path.name)
        directory, candidates = path.parent, [(int(match.group(1)) if match else None, path)]
    elif path.exists():
        raise EvidenceError(f"{path}: not a report directory or a regular file")
    else:
        raise EvidenceError(f"{path}: no such report directory or file")
    by_rank: dict[int, tuple[Record, ...]] = {}
    keyed: list[tuple[float, int, int, Record]] = []
    files: list[Path] = []
    for rank, file in candidates:
        records = _read_file(file, problem)
        if records is None:
            continue
        files.append(file)
        if rank is not None:  # several runs: one file per run for the same rank
            by_rank[rank] = by_rank.get(rank, ()) + records
        keyed.extend((r.time, -1 if rank is None else rank, i, r) for i, r in enumerate(records))
    keyed.sort(key=lambda item: item[:3])
    return Report(
        directory=directory,
        records=tuple(item[3] for item in keyed),
        by_rank=dict(sorted(by_rank.items())),
        files=tuple(files),
        problems=tuple(problems),
    )


def _run_dirs(directory: Path) -> list[Path]:
    """Subdirectories that may hold a run's rank files, by name (not one named like a file)."""
    runs = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if _NUMBERED.match(entry.name) or entry.name.startswith("rank-"):
            continue
        try:
            if entry.is_dir():
                runs.append(Path(entry.path))
        except OSError:
            continue
    return runs


def _rank_files(directory: Path, problem: _Problem) -> list[tuple[int | None, Path]]:
    """``(rank, path)`` of every canonical rank file; odd names go to ``problem``."""
    names = sorted(
        (e.name for e in os.scandir(directory)),
        key=lambda n: (int(m.group(1)) if (m := _NUMBERED.match(n)) else -1, n),
    )
    found: list[tuple[int | None, Path]] = []
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".jsonl")):
            continue  # not evidence: other files may live beside the report
        if (match := RANK_FILE.match(name)) is not None:
            found.append((int(match.group(1)), directory / name))
        elif (match := _NUMBERED.match(name)) is not None:
            rank = int(match.group(1))
            problem(
                directory / name,
                None,
                f"odd name: rank {rank} writes rank-{rank}.jsonl, so this file is not read "
                f"as rank {rank}'s",
            )
        else:
            problem(directory / name, None, "not a rank file (rank-<global rank>.jsonl)")
    return found


def _read_file(path: Path, problem: _Problem) -> tuple[Record, ...] | None:
    """The records of one file, or ``None`` if it could not be read at all."""
    try:
        kind = _not_regular(os.stat(path).st_mode)
    except OSError as exc:  # a dangling symlink, a permission problem
        problem(path, None, f"cannot read: {exc.strerror or exc}")
        return None
    if kind is not None:
        problem(path, None, f"is {kind}, not a regular file")
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        problem(path, None, f"cannot open: {exc.strerror or exc}")
        return None
    with os.fdopen(fd, "rb") as stream:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind is not None:  # swapped after the stat
            problem(path, None, f"is {kind}, not a regular file")
            return None
        return tuple(_records(path, stream, problem))


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _records(path: Path, stream: BinaryIO, problem: _Problem) -> Iterator[Record]:
    number = 0
    while raw := stream.readline(_MAX_LINE + 1):
        number += 1
        if len(raw) > _MAX_LINE and not raw.endswith(b"\n"):
            while (rest := stream.readline(_MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            problem(path, number, f"line longer than {_MAX_LINE >> 20} MiB")
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem(path, number, f"not valid UTF-8 (byte {exc.start})")
            continue
        if not line.strip():
            continue
        try:
            yield Record.from_json(line)
        except EvidenceError as exc:
            if not raw.endswith(b"\n"):
                problem(path, number, f"truncated last line (no newline at the end): {exc}")
            else:
                problem(path, number, str(exc))
