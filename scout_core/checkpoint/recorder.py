"""The one writer of checkpoint-gate evidence: ``scout.checkpoint/1`` records.

Every decision of either gate and every restore is one record, written once for the job
by its lowest rank, with the fields docs/evidence.md documents (``action``, ``selected``,
``checkpoint_step``, ``detail``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scout_core.decision.gate import Selection
from scout_core.records.evidence import EvidenceWriter
from scout_core.records.record import CHECKPOINT_SCHEMA, Record
from scout_core.vocabulary import Failure, Scope

__all__ = ["GateRecorder", "write_gate_record"]


def write_gate_record(
    writer: EvidenceWriter | None,
    *,
    run_id: str,
    ranks: Sequence[int],
    action: str,
    step: int,
    checkpoint_step: int | None,
    selected: Selection | None = None,
    failure: Failure | None = None,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """Write one gate decision as a ``scout.checkpoint/1`` record, by the job's lowest rank."""
    if writer is None:
        return
    writer.write_group(
        Record(
            schema=CHECKPOINT_SCHEMA,
            run_id=run_id,
            step=step,
            surface="gate",
            failure=failure,
            group=tuple(ranks),
            scope=Scope.JOB,
            action=action,
            selected=None if selected is None else selected.value,
            checkpoint_step=checkpoint_step,
            detail=dict(detail or {}),
        )
    )


class GateRecorder:
    """:func:`write_gate_record` bound to one gate's writer, run and job ranks."""

    def __init__(self, writer: EvidenceWriter | None, *, run_id: str, ranks: Sequence[int]) -> None:
        self.writer = writer
        self.run_id = run_id
        self.ranks = tuple(ranks)

    def __call__(
        self,
        action: str,
        step: int,
        checkpoint_step: int | None,
        *,
        selected: Selection | None = None,
        failure: Failure | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Write one ``scout.checkpoint/1`` record (once for the job, by its lowest rank)."""
        write_gate_record(
            self.writer,
            run_id=self.run_id,
            ranks=self.ranks,
            action=action,
            step=max(step, 0),
            checkpoint_step=checkpoint_step,
            selected=selected,
            failure=failure,
            detail=detail,
        )
