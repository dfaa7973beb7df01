"""Attributions in the console: one WARNING line per record that names a culprit.

Records go to files that a person opens after the fact; while the job runs, people
watch its console. So the rank that writes a record naming outliers also logs it, at
WARNING, on this module's logger (``scout_core.records.console``)::

    scout[rank 0]: straggler rank 2 at step 7 on layer/layers.3/t_M (vm): rank 2: 604.0 ms
    vs peer median 3.8 ms (159x)

(one line in the log; wrapped here)

The line says who wrote it (``scout[rank R]``), what failed, who, when, where and the
one line of evidence that ``scout report`` shows for the same record
(:func:`scout_core.records.wording.evidence_line`). Agreeing rounds, inconclusive
rounds and gate decisions stay in the files, and so do the later *revisions* of an
incident (a lasting straggler revises its incident every window with the same
culprits): the console says an incident once, when it opens. Python's last-resort handler prints
WARNING records to stderr when the application configured no logging, so the line is
visible by default; an application that configures logging gets it through its own
handlers, like any other library's warning.
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
