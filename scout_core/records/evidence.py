"""Evidence records: SCOUT's decisions, one JSON object per line, one file per rank.

Every decision SCOUT makes (a C3 verdict on a replay surface, a hang diagnosis, a
checkpoint-gate transition) becomes a :class:`Record` appended to
``<report_dir>/rank-<global rank>.jsonl``. A peer group's record is written once, by
the group's lowest global rank (:meth:`EvidenceWriter.write_group`), so a report
holds each decision exactly once however large the group. An external recovery
policy, ``scout report`` and the tests read the directory back with
:func:`load_report`.

The format is a contract with tools outside this package, so it is versioned
(``schema``), strict in both directions (a record is validated when built and when
read; unknown fields and unknown schemas are errors, not guesses), and plain JSON:
enums are written as their string values and no value may be NaN or infinite.
``docs/evidence.md`` describes every field.

Writes use one ``os.write`` on an ``O_APPEND`` descriptor per record: nothing waits
in a user-space buffer, so a record survives the process dying right after
``write`` returns, and two writers of the same file (a trainer thread and the
observer path) cannot interleave inside a line.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time as _time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from scout_core.errors import EvidenceError
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = [
    "VERDICT_SCHEMA",
    "CHECKPOINT_SCHEMA",
    "SCHEMAS",
    "ACTIONS",
    "SELECTIONS",
    "Record",
    "EvidenceWriter",
    "Report",
    "load_report",
]

VERDICT_SCHEMA = "scout.verdict/1"
"""Schema of a decision about peers: a C3 surface, a straggler, a hang."""
CHECKPOINT_SCHEMA = "scout.checkpoint/1"
"""Schema of a checkpoint-gate decision: capture, candidate, promote, retrieve."""
SCHEMAS: tuple[str, ...] = (VERDICT_SCHEMA, CHECKPOINT_SCHEMA)

ACTIONS: tuple[str, ...] = ("capture", "candidate", "promote", "retrieve")
"""Checkpoint-gate actions a ``scout.checkpoint/1`` record may carry."""
SELECTIONS: tuple[str, ...] = ("latest", "verified")
"""Which checkpoint a retrieval selected."""

_FILE_NAME = re.compile(r"^rank-(\d+)\.jsonl$")
_E = TypeVar("_E", Mode, Status, Failure, Scope)


@dataclass(frozen=True, kw_only=True)
class Record:
    """One decision. Built validated; ``to_json`` / ``from_json`` round-trip it exactly."""

    schema: str
    """``scout.verdict/1`` or ``scout.checkpoint/1``."""
    run_id: str
    """Run identity (``Config.resolved_run_id()``), equal on every rank."""
    step: int
    """Optimizer step the evidence belongs to."""
    surface: str
    """What was compared, e.g. ``layer/<module path>/forward``, ``progress``, ``gate``."""
    time: float = field(default_factory=_time.time)
    """Unix wall-clock seconds when the decision was made (a timestamp, not a duration)."""
    mode: Mode | None = None
    """How C3 compared the evidence; required on verdicts."""
    status: Status | None = None
    """C3 outcome; required on verdicts. ``attributed`` iff ``outliers`` is non-empty."""
    failure: Failure | None = None
    """The failure this decision reports, or ``None``."""
    group: tuple[int, ...] = ()
    """The peer group, as global ranks in peer order."""
    outliers: tuple[int, ...] = ()
    """Attributed global ranks, a subset of ``group``."""
    scope: Scope | None = None
    """How far the verdict points: rank, group, machine or job."""
    hosts: tuple[str, ...] = ()
    """Host names of the outliers."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """JSON-safe extra evidence: values, timings, reasons."""
    action: str | None = None
    """Checkpoint records: one of ``ACTIONS``."""
    selected: str | None = None
    """Checkpoint records: ``latest`` or ``verified`` (required on ``retrieve``)."""
    checkpoint_step: int | None = None
    """Checkpoint records: the step of the checkpoint acted on (``None`` only when a
    retrieval found nothing to select)."""

    def __post_init__(self) -> None:
        # Frozen: normalised values go in through object.__setattr__.
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if self.schema not in SCHEMAS:
            raise EvidenceError(f"unknown schema {self.schema!r}; known: {', '.join(SCHEMAS)}")
        if not isinstance(self.run_id, str) or not self.run_id:
            raise EvidenceError(f"field 'run_id' must be a non-empty string, got {self.run_id!r}")
        put("step", _non_negative_int("step", self.step))
        if not isinstance(self.surface, str) or not self.surface:
            raise EvidenceError(f"field 'surface' must be a non-empty string, got {self.surface!r}")
        if isinstance(self.time, bool) or not isinstance(self.time, int | float):
            raise EvidenceError(f"field 'time' must be a number, got {self.time!r}")
        if not math.isfinite(self.time):
            raise EvidenceError(f"field 'time' must be finite, got {self.time!r}")
        put("time", float(self.time))
        put("mode", _enum("mode", Mode, self.mode))
        put("status", _enum("status", Status, self.status))
        put("failure", _enum("failure", Failure, self.failure))
        put("scope", _enum("scope", Scope, self.scope))
        put("group", _ranks("group", self.group))
        put("outliers", _ranks("outliers", self.outliers))
        if not isinstance(self.hosts, list | tuple) or not all(
            isinstance(h, str) for h in self.hosts
        ):
            raise EvidenceError(f"field 'hosts' must be a list of strings, got {self.hosts!r}")
        put("hosts", tuple(self.hosts))
        put("detail", _json_safe_detail(self.detail))
        stray = sorted(set(self.outliers) - set(self.group))
        if stray:
            raise EvidenceError(
                f"field 'outliers' names ranks {stray} that are not in 'group' {list(self.group)}"
            )
        # C3's contract: attributed has a set bitmap; agree and inconclusive have none.
        if self.status is not None and (self.status is Status.ATTRIBUTED) != bool(self.outliers):
            raise EvidenceError(
                f"field 'outliers' is {list(self.outliers)} but status is "
                f"{self.status.value!r}; only 'attributed' names outliers"
            )
        if self.schema == VERDICT_SCHEMA:
            self._check_verdict()
        else:
            self._check_checkpoint()

    def _check_verdict(self) -> None:
        for name in ("mode", "status"):
            if getattr(self, name) is None:
                raise EvidenceError(f"{VERDICT_SCHEMA} record needs field {name!r}")
        for name in ("action", "selected", "checkpoint_step"):
            if getattr(self, name) is not None:
                raise EvidenceError(
                    f"field {name!r} belongs to {CHECKPOINT_SCHEMA} records, not {VERDICT_SCHEMA}"
                )

    def _check_checkpoint(self) -> None:
        if self.action is None:
            raise EvidenceError(
                f"{CHECKPOINT_SCHEMA} record needs field 'action' (one of {', '.join(ACTIONS)})"
            )
        if self.action not in ACTIONS:
            raise EvidenceError(
                f"field 'action' must be one of {', '.join(ACTIONS)}; got {self.action!r}"
            )
        if self.selected is not None and self.selected not in SELECTIONS:
            raise EvidenceError(
                f"field 'selected' must be one of {', '.join(SELECTIONS)} or null; "
                f"got {self.selected!r}"
            )
        if self.action == "retrieve" and self.selected is None:
            raise EvidenceError("a 'retrieve' record needs field 'selected' (latest or verified)")
        if self.checkpoint_step is None:
            if self.action != "retrieve":
                raise EvidenceError(f"a {self.action!r} record needs field 'checkpoint_step'")
        else:
            object.__setattr__(
                self, "checkpoint_step", _non_negative_int("checkpoint_step", self.checkpoint_step)
            )

    # -- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready: enums as their values, tuples as lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mode | Status | Failure | Scope):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            elif f.name == "detail":
                value = dict(value)
            out[f.name] = value
        return out

    def to_json(self) -> str:
        """One line of JSON with sorted keys; no NaN or infinity."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """Read a record back; the schema must be known and every field present, no others."""
        if not isinstance(data, Mapping):
            raise EvidenceError(f"a record must be a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if schema not in SCHEMAS:
            raise EvidenceError(f"unknown schema {schema!r}; known: {', '.join(SCHEMAS)}")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise EvidenceError(f"{schema} record is missing field {missing[0]!r}")
        extra = sorted(set(data) - set(names))
        if extra:
            raise EvidenceError(f"{schema} record has unknown field {extra[0]!r}")
        return cls(**{n: data[n] for n in names})

    @classmethod
    def from_json(cls, line: str) -> Record:
        """Parse one line written by :meth:`to_json`."""
        try:
            data = json.loads(line, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise EvidenceError(f"not valid JSON: {exc}") from None
        return cls.from_dict(data)


def _reject_constant(name: str) -> float:
    raise EvidenceError(f"{name} is not valid in an evidence record")


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EvidenceError(f"field {name!r} must be an integer >= 0, got {value!r}")
    return value


def _enum(name: str, kind: type[_E], value: object) -> _E | None:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(member.value for member in kind)
        raise EvidenceError(
            f"field {name!r} must be one of {valid} or null; got {value!r}"
        ) from None


def _ranks(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise EvidenceError(f"field {name!r} must be a list of global ranks, got {value!r}")
    ranks = tuple(_non_negative_int(name, r) for r in value)
    if len(set(ranks)) != len(ranks):
        raise EvidenceError(f"field {name!r} repeats a rank: {list(ranks)}")
    return ranks


def _json_safe_detail(value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise EvidenceError(f"field 'detail' must be an object with string keys, got {value!r}")
    try:
        # Round-trip through JSON: the record then holds exactly what a reader will
        # see (tuples become lists), and NaN/inf or a non-JSON value fails here, at
        # the writer, not in someone's recovery policy.
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EvidenceError(f"field 'detail' is not JSON-safe: {exc}") from None
    loaded: dict[str, Any] = json.loads(text)
    return loaded


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


# -- reading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """All records of one report directory."""

    directory: Path
    records: tuple[Record, ...]
    """Every record, sorted by time, then by the rank whose file holds it."""
    by_rank: Mapping[int, tuple[Record, ...]]
    """Records per writing rank, in file order."""

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


def load_report(report_dir: str | os.PathLike[str]) -> Report:
    """Read every ``rank-<r>.jsonl`` under ``report_dir``.

    A malformed line raises :class:`EvidenceError` naming the file and line number;
    blank lines are skipped. A directory without rank files gives an empty report.
    """
    directory = Path(report_dir)
    if not directory.is_dir():
        raise EvidenceError(f"{directory}: no such report directory")
    by_rank: dict[int, tuple[Record, ...]] = {}
    keyed: list[tuple[float, int, int, Record]] = []
    for path in sorted(directory.glob("rank-*.jsonl")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise EvidenceError(f"{path}: not a rank file (expected rank-<global rank>.jsonl)")
        rank = int(match.group(1))
        records = tuple(_read_lines(path, path.read_text(encoding="utf-8").splitlines()))
        by_rank[rank] = records
        keyed.extend((r.time, rank, i, r) for i, r in enumerate(records))
    keyed.sort(key=lambda item: item[:3])
    return Report(
        directory=directory,
        records=tuple(item[3] for item in keyed),
        by_rank=dict(sorted(by_rank.items())),
    )


def _read_lines(path: Path, lines: Iterable[str]) -> Iterable[Record]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield Record.from_json(line)
        except EvidenceError as exc:
            raise EvidenceError(f"{path}:{number}: {exc}") from None
