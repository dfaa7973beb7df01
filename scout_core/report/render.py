"""Evidence records as a fixed-width table, one line each (step, failure, culprit, scope,
surface, peers); agreeing rounds only on request, since a healthy run writes many."""

from __future__ import annotations

from collections.abc import Iterable

from scout_core.records.record import Record
from scout_core.vocabulary import Status

__all__ = ["culprit", "notable", "render_records"]

_HEADER = ("step", "failure", "culprit", "scope", "surface", "peers")


def culprit(record: Record) -> str:
    """Who the record points at, in words."""
    if record.outliers and record.scope is not None and record.scope.value == "rank":
        return "rank " + ",".join(str(r) for r in record.outliers)
    if record.hosts and record.scope is not None and record.scope.value == "machine":
        return "host " + ",".join(record.hosts)
    if record.status is Status.INCONCLUSIVE:
        return "(no majority)"
    if record.failure is None:
        return "-"
    return f"(whole {record.scope.value if record.scope else 'group'})"


def _row(record: Record) -> tuple[str, ...]:
    if record.action is not None:  # a checkpoint-gate decision
        what = f"ckpt {record.action}"
        step = "none yet" if record.checkpoint_step is None else f"step {record.checkpoint_step}"
        who = f"{record.selected or ''} {step}".strip()
    else:
        what = (
            record.failure.value
            if record.failure
            else (record.status.value if record.status else "-")
        )
        who = culprit(record)
    peers = "[" + ",".join(str(r) for r in record.group) + "]"
    scope = record.scope.value if record.scope else "-"
    return (str(record.step), what, who, scope, record.surface, peers)


def notable(record: Record) -> bool:
    """Worth showing by default: a failure, an inconclusive round, a gate transition."""
    if record.action is not None:
        return record.action != "capture"
    return record.failure is not None or record.status is not Status.AGREE


def render_records(records: Iterable[Record], *, include_agree: bool = False) -> str:
    """A fixed-width table of ``records``; ``include_agree`` adds what :func:`notable` skips."""
    rows = [_row(r) for r in records if include_agree or notable(r)]
    if not rows:
        return "no failures recorded"
    table = [_HEADER, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_HEADER))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    return "\n".join(lines)
