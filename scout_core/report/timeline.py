"""What ``scout report`` shows, as plain data: a filtered timeline of a report's records.

Contract: :func:`build_timeline` turns a :class:`~scout_core.records.reading.Report` and a
:class:`Selection` into one :class:`Timeline` of four sections in reading order (incidents,
verdicts, gate decisions, the restore), each row with its step, culprit, host, surface,
time to verdict and one line of evidence. The terminal view, ``--json``, the HTML page and
the pictures all draw from that one timeline, so they cannot disagree. Rows and time to
verdict: docs/report.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scout_core.records.reading import Report
from scout_core.records.record import CHECKPOINT_SCHEMA, INCIDENT_SCHEMA, Record
from scout_core.records.wording import evidence_line
from scout_core.report.render import culprit, notable
from scout_core.vocabulary import Failure

__all__ = [
    "SECTIONS",
    "Row",
    "Selection",
    "Timeline",
    "build_timeline",
    "clock",
    "is_finding",
    "ttv_text",
]

SECTIONS: tuple[str, ...] = ("incidents", "verdicts", "gate", "restore")


@dataclass(frozen=True)
class Selection:
    """Which records the report shows (the ``scout report`` filters)."""

    run_id: str | None = None
    """Only this run; ``None``: every run in the directory."""
    ranks: frozenset[int] = frozenset()
    """Only records naming one of these ranks (in ``outliers`` or ``group``); empty: all."""
    failures: frozenset[Failure] = frozenset()
    """Only records reporting one of these failures; empty: all."""
    include_routine: bool = False
    """Also records that agree and name no failure (``--all``). SCOUT itself writes none
    (a healthy replay round leaves no record); another writer of the schema may."""

    def keeps(self, record: Record) -> bool:
        if self.run_id is not None and record.run_id != self.run_id:
            return False
        if self.ranks and not self.ranks.intersection((*record.group, *record.outliers)):
            return False
        if self.failures and record.failure not in self.failures:
            return False
        return self.include_routine or notable(record)


@dataclass(frozen=True)
class Row:
    """One record as the report shows it."""

    record: Record
    section: str
    ttv_s: float | None
    """Time to verdict in seconds (module note), or ``None`` when the report cannot say."""
    evidence: str
    incident: str | None
    """Id of the incident that cites this record, if any."""

    @property
    def what(self) -> str:
        r = self.record
        if r.action is not None:
            return r.action
        if r.failure is not None:
            return r.failure.value
        return r.status.value if r.status is not None else "-"

    @property
    def step(self) -> str:
        d = self.record.detail
        if self.section == "incidents" and d.get("last_step", self.record.step) != self.record.step:
            return f"{self.record.step}-{d['last_step']}"
        return str(self.record.step)

    @property
    def culprit(self) -> str:
        r = self.record
        if r.action is not None:
            chosen = "(none yet)" if r.checkpoint_step is None else f"step {r.checkpoint_step}"
            return f"{r.selected} {chosen}" if r.selected else chosen
        return culprit(r)

    def to_dict(self) -> dict[str, Any]:
        """The record, its id and the derived columns, JSON-ready."""
        return {
            "id": self.record.id,
            "section": self.section,
            "what": self.what,
            "culprit": self.culprit,
            "ttv_s": self.ttv_s,
            "evidence": self.evidence,
            "incident": self.incident,
            "record": self.record.to_dict(),
        }


@dataclass(frozen=True)
class Timeline:
    """The rows of a report, by section, after the selection."""

    report: Report
    selection: Selection
    sections: Mapping[str, tuple[Row, ...]] = field(default_factory=dict)

    @property
    def rows(self) -> tuple[Row, ...]:
        return tuple(row for name in SECTIONS for row in self.sections.get(name, ()))

    def findings(self) -> tuple[Row, ...]:
        """Rows that report a failure (what makes ``scout report`` exit 1)."""
        return tuple(row for row in self.rows if is_finding(row.record))

    def pictured_run(self) -> str | None:
        """The run the pictures show: the selected one, else the latest."""
        if self.selection.run_id is not None:
            return self.selection.run_id
        return self.report.records[-1].run_id if self.report.records else None


def clock(seconds: float) -> str:
    """A record time as local ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def ttv_text(row: Row) -> str:
    """Time to verdict for a person: ``1.23 s``, ``-`` when unknown."""
    return "-" if row.ttv_s is None else f"{row.ttv_s:.2f} s"


def is_finding(record: Record) -> bool:
    """An incident, or a verdict naming a failure (on ranks, or a group when no rank can be)."""
    if record.schema == INCIDENT_SCHEMA:
        return True
    return record.schema != CHECKPOINT_SCHEMA and record.failure is not None


def _section(record: Record) -> str:
    if record.schema == INCIDENT_SCHEMA:
        return "incidents"
    if record.schema == CHECKPOINT_SCHEMA:
        return "restore" if record.action == "retrieve" else "gate"
    return "verdicts"


def build_timeline(report: Report, selection: Selection | None = None) -> Timeline:
    """Rows of ``report`` that ``selection`` keeps, sectioned, each in time order."""
    chosen = selection or Selection()
    boundary = _last_time_per_step(report.records)
    by_id = {r.id: r for r in report.records}
    cited = {
        ref: inc.id
        for inc in report.incidents()
        for key in ("corroborating", "explained")
        for ref in inc.detail.get(key, ())
    }
    same_step = _sdc_surfaces(report.records)
    current = {inc.id for inc in report.incidents()}
    sections: dict[str, list[Row]] = {name: [] for name in SECTIONS}
    for record in report.records:
        if not chosen.keeps(record):
            continue
        if record.schema == INCIDENT_SCHEMA and record.id not in current:
            continue  # an older revision of an incident shown in its newest form
        section = _section(record)
        ttv = _incident_ttv(record, by_id) if section == "incidents" else _ttv(record, boundary)
        evidence = evidence_line(record, same_step)
        sections[section].append(Row(record, section, ttv, evidence, cited.get(record.id)))
    return Timeline(report, chosen, {name: tuple(rows) for name, rows in sections.items()})


# -- time to verdict ---------------------------------------------------------------------


def _last_time_per_step(records: Iterable[Record]) -> dict[tuple[str, int], float]:
    last: dict[tuple[str, int], float] = {}
    for r in records:
        key = (r.run_id, r.step)
        last[key] = max(last.get(key, r.time), r.time)
    return last


def _quiet(record: Record) -> float | None:
    quiet = record.detail.get("quiet_s")
    if not isinstance(quiet, Mapping):
        return None
    wanted = [str(r) for r in record.outliers] or list(quiet)
    values = [float(v) for k, v in quiet.items() if k in wanted and isinstance(v, int | float)]
    return max(values) if values else None


def _ttv(record: Record, boundary: Mapping[tuple[str, int], float]) -> float | None:
    if record.schema == CHECKPOINT_SCHEMA:
        return None
    quiet = _quiet(record)
    if quiet is not None:
        return quiet
    before = boundary.get((record.run_id, record.step - 1))
    return record.time - before if before is not None and before <= record.time else None


def _incident_ttv(record: Record, by_id: Mapping[str, Record]) -> float | None:
    refs = [by_id[i] for i in record.detail.get("corroborating", ()) if i in by_id]
    return record.time - min(r.time for r in refs) if refs else None


# -- one line of evidence ----------------------------------------------------------------


def _sdc_surfaces(records: Sequence[Record]) -> dict[tuple[str, int], list[str]]:
    """Surfaces an SDC verdict was reported on, per (run, step): what differed together."""
    out: dict[tuple[str, int], list[str]] = {}
    for r in records:
        if r.failure is Failure.SDC and r.schema not in (CHECKPOINT_SCHEMA, INCIDENT_SCHEMA):
            seen = out.setdefault((r.run_id, r.step), [])
            if r.surface not in seen:
                seen.append(r.surface)
    return out
