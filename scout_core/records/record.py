"""The evidence record: one SCOUT decision, validated, versioned and plain JSON.

Contract: a :class:`Record` (``scout.verdict/1``, ``scout.checkpoint/1`` or
``scout.incident/1``) is validated when built and when read, unknown fields and schemas
are errors, and values are plain JSON (enums as their strings, no NaN or infinity). Its
``id`` is a blake2b of its canonical JSON without ``time``: derived, never stored, so the
same decision written twice has one id. Docs: docs/evidence.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import time as _time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from scout_core.errors import EvidenceError
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = [
    "VERDICT_SCHEMA",
    "CHECKPOINT_SCHEMA",
    "INCIDENT_SCHEMA",
    "SCHEMAS",
    "ACTIONS",
    "SELECTIONS",
    "ID_LENGTH",
    "Record",
]

VERDICT_SCHEMA = "scout.verdict/1"
"""Schema of a decision about peers: a C3 surface, a straggler, a hang."""
CHECKPOINT_SCHEMA = "scout.checkpoint/1"
"""Schema of a checkpoint-gate decision: capture, candidate, promote, retrieve."""
INCIDENT_SCHEMA = "scout.incident/1"
"""Schema of a job-level incident: the records of one failure merged into one answer."""
SCHEMAS: tuple[str, ...] = (VERDICT_SCHEMA, CHECKPOINT_SCHEMA, INCIDENT_SCHEMA)

ACTIONS: tuple[str, ...] = ("capture", "candidate", "promote", "retrieve")
SELECTIONS: tuple[str, ...] = ("latest", "verified")
ID_LENGTH = 16
"""Hex digits of a record id (a 64-bit blake2b digest)."""

_ID = re.compile(rf"^[0-9a-f]{{{ID_LENGTH}}}$")

_E = TypeVar("_E", Mode, Status, Failure, Scope)


@dataclass(frozen=True, kw_only=True)
class Record:
    """One decision. Built validated; ``to_json`` / ``from_json`` round-trip it exactly."""

    schema: str
    run_id: str
    """Run identity (``Config.resolved_run_id()``), equal on every rank."""
    step: int
    """Optimizer step the evidence belongs to (an incident: its first step)."""
    surface: str
    """What was compared, e.g. ``layer/<module path>/forward``, ``progress``, ``gate``."""
    time: float = field(default_factory=_time.time)
    """Unix wall-clock seconds when the decision was made (a timestamp, not a duration)."""
    mode: Mode | None = None
    """How C3 compared the evidence; required on verdicts."""
    status: Status | None = None
    """C3 outcome; required on verdicts. ``attributed`` iff ``outliers`` is non-empty."""
    failure: Failure | None = None
    group: tuple[int, ...] = ()
    """The peer group, as global ranks in peer order."""
    outliers: tuple[int, ...] = ()
    """Attributed global ranks, a subset of ``group``."""
    scope: Scope | None = None
    """How far the verdict points: rank, group, machine or job."""
    hosts: tuple[str, ...] = ()
    """Host names of the outliers."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """JSON-safe extra evidence: values, timings, reasons (incidents: :meth:`_check_incident`)."""
    action: str | None = None
    """Checkpoint records: one of ``ACTIONS``."""
    selected: str | None = None
    """Checkpoint records: ``latest`` or ``verified`` (required on ``retrieve``)."""
    checkpoint_step: int | None = None
    """Checkpoint records: the step acted on (``None`` only when a retrieval found nothing)."""

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
        elif self.schema == CHECKPOINT_SCHEMA:
            self._check_checkpoint()
        else:
            self._check_incident()

    @functools.cached_property
    def id(self) -> str:
        """A stable id: blake2b-64 of the canonical JSON without ``time`` (module doc);
        cached outside the fields, so equality, hashing and ``to_dict`` are unchanged."""
        data = self.to_dict()
        del data["time"]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.blake2b(text.encode("utf-8"), digest_size=ID_LENGTH // 2).hexdigest()

    def _check_verdict(self) -> None:
        for name in ("mode", "status"):
            if getattr(self, name) is None:
                raise EvidenceError(f"{VERDICT_SCHEMA} record needs field {name!r}")
        self._no_checkpoint_fields()

    def _no_checkpoint_fields(self) -> None:
        for name in ("action", "selected", "checkpoint_step"):
            if getattr(self, name) is not None:
                raise EvidenceError(
                    f"field {name!r} belongs to {CHECKPOINT_SCHEMA} records, not {self.schema}"
                )

    def _check_incident(self) -> None:
        """An incident names its failure and ranks (``outliers`` may be empty, ``group`` may
        not), and ``detail`` holds the keys docs/evidence.md, "Incidents", lists."""
        self._no_checkpoint_fields()
        if self.failure is None:
            raise EvidenceError(f"{INCIDENT_SCHEMA} record needs field 'failure'")
        if not self.group:
            raise EvidenceError(f"{INCIDENT_SCHEMA} record needs the ranks involved in 'group'")
        d = self.detail
        first = _non_negative_int("detail.first_step", d.get("first_step"))
        last = _non_negative_int("detail.last_step", d.get("last_step"))
        if first != self.step:
            raise EvidenceError(f"detail.first_step {first} must equal field 'step' {self.step}")
        if last < first:
            raise EvidenceError(f"detail.last_step {last} is before detail.first_step {first}")
        for key in ("corroborating", "explained"):
            ids = d.get(key)
            if not isinstance(ids, list) or not all(_is_id(i) for i in ids):
                raise EvidenceError(
                    f"detail.{key} must be a list of {ID_LENGTH}-hex-digit record ids, got {ids!r}"
                )
        summary = d.get("summary")
        if not isinstance(summary, str) or not summary.strip() or "\n" in summary:
            raise EvidenceError(f"detail.summary must be one non-empty line, got {summary!r}")

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
        try:
            return cls(**{n: data[n] for n in names})
        except EvidenceError:
            raise
        except RecursionError:
            raise EvidenceError(f"{schema} record is nested too deeply") from None
        except (OverflowError, TypeError, ValueError) as exc:  # e.g. a 400-digit "time"
            raise EvidenceError(f"{schema} record has a malformed value: {exc}") from None

    @classmethod
    def from_json(cls, line: str) -> Record:
        """Parse one line written by :meth:`to_json`; anything else is :class:`EvidenceError`."""
        try:
            data = json.loads(line, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise EvidenceError(f"not valid JSON: {exc}") from None
        except RecursionError:
            raise EvidenceError("not valid JSON: nested too deeply") from None
        return cls.from_dict(data)


def _is_id(value: object) -> bool:
    return isinstance(value, str) and _ID.match(value) is not None


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
        # Round-trip through JSON: the record holds what a reader will see, and NaN/inf or
        # a non-JSON value fails here, at the writer, not in someone's recovery policy.
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EvidenceError(f"field 'detail' is not JSON-safe: {exc}") from None
    loaded: dict[str, Any] = json.loads(text)
    return loaded
