"""A record's evidence in one line of words, as the console line and ``scout report`` show it.

A straggler's timing against the peer median, the surfaces and signatures an SDC differed
on, a hang's stage and silence, a gate decision's reason, an incident's summary.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from typing import TypeGuard

from scout_core.records.record import INCIDENT_SCHEMA, Record
from scout_core.vocabulary import Failure

__all__ = ["evidence_line"]


def evidence_line(
    record: Record, sdc_surfaces: Mapping[tuple[str, int], list[str]] | None = None
) -> str:
    """The one line of evidence for ``record``; an SDC names the surfaces ``sdc_surfaces``
    lists for its (run, step) (a timeline's: every surface of the step), else its own."""
    d = record.detail
    if record.schema == INCIDENT_SCHEMA:
        return str(d.get("summary", ""))
    if record.action is not None:
        return str(d.get("reason", ""))
    parts: list[str] = []
    if record.failure is Failure.STRAGGLER:
        parts.append(_straggler(record) or "")
    elif record.failure is Failure.SDC:
        surfaces = (sdc_surfaces or {}).get((record.run_id, record.step), [record.surface])
        parts.append("differs: " + ", ".join(surfaces))
        parts.append(_signatures(record) or "")
    elif record.failure is Failure.COMM_STRAGGLER:
        parts.append(str(d.get("explanation", "")))
    if "position" in d and isinstance(d["position"], Mapping):
        stages = d.get("stages", {})
        parts.extend(
            f"rank {r} {pos}"
            + (f" in {stages[r]}" if isinstance(stages, Mapping) and r in stages else "")
            for r, pos in d["position"].items()
        )
    if "reason" in d and not parts:
        parts.append(str(d["reason"]))
    return "; ".join(p for p in parts if p)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _straggler(record: Record) -> str | None:
    values = record.detail.get("evidence")
    if not isinstance(values, list) or len(values) != len(record.group):
        return None
    timings = {r: float(v) for r, v in zip(record.group, values, strict=True) if _number(v)}
    if not timings:
        return None
    given = record.detail.get("median_s")
    median = float(given) if _number(given) else statistics.median(timings.values())
    parts = []
    for r in record.outliers:
        if r in timings:
            ratio = f" ({timings[r] / median:.0f}x)" if median > 0 else ""
            parts.append(f"rank {r}: {_ms(timings[r])} vs peer median {_ms(median)}{ratio}")
    return "; ".join(parts) or None


def _signatures(record: Record) -> str | None:
    values = record.detail.get("evidence")
    if not isinstance(values, list) or len(values) != len(record.group) or not record.outliers:
        return None
    common = Counter(str(v) for v in values).most_common(1)[0][0]
    odd = [
        f"rank {r} {str(v)[:8]}"
        for r, v in zip(record.group, values, strict=True)
        if str(v) != common
    ]
    return f"{', '.join(odd)} vs {common[:8]} (others)"


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
