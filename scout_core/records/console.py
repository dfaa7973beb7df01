"""Attributions in the console: one WARNING line per record that names a culprit.

Contract: :func:`log_attribution` logs, on the rank that writes a record naming outliers,
one WARNING line on this module's logger (:func:`attribution_line`); records naming
nobody, gate decisions and later revisions of an incident are not logged. Docs:
docs/evidence.md, "Who writes what".
"""

from __future__ import annotations

import logging

from scout_core.records.record import INCIDENT_SCHEMA, Record
from scout_core.records.wording import evidence_line

__all__ = ["attribution_line", "log_attribution"]

log = logging.getLogger(__name__)


def attribution_line(record: Record, rank: int) -> str | None:
    """The console line for ``record`` written by ``rank``, or ``None`` if it names no one."""
    if not record.outliers or record.action is not None:
        return None
    if record.schema == INCIDENT_SCHEMA and _revision(record) > 0:
        return None  # the same incident, said once when it opened (module doc)
    what = record.failure.value if record.failure is not None else "finding"
    if record.schema == INCIDENT_SCHEMA:
        what = f"incident: {what}"
    who = "rank" if len(record.outliers) == 1 else "ranks"
    culprits = ",".join(str(r) for r in record.outliers)
    line = f"scout[rank {rank}]: {what} {who} {culprits} at step {record.step} on {record.surface}"
    if record.hosts:
        line += f" ({', '.join(record.hosts)})"
    evidence = evidence_line(record)
    return f"{line}: {evidence}" if evidence else line


def _revision(record: Record) -> int:
    revision = record.detail.get("revision", 0) if record.detail else 0
    return revision if isinstance(revision, int) else 0


def log_attribution(record: Record, rank: int) -> None:
    """Log ``record`` at WARNING if it names a culprit; never raises."""
    try:
        line = attribution_line(record, rank)
    except Exception as exc:  # a console line must never cost the record
        log.debug("could not describe record %s: %s", record.id, exc)
        return
    if line is not None:
        log.warning("%s", line)
