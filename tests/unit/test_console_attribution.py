"""The console line a rank logs when it writes a record that names a culprit."""

from __future__ import annotations

import logging

import pytest

from scout_core.records.console import attribution_line, log_attribution
from scout_core.records.evidence import EvidenceWriter
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status


def _straggler() -> Record:
    return Record(
        schema=VERDICT_SCHEMA,
        run_id="r",
        step=7,
        surface="layer/layers.3/t_M",
        mode=Mode.STATISTICAL,
        status=Status.ATTRIBUTED,
        failure=Failure.STRAGGLER,
        group=(0, 1, 2, 3),
        outliers=(2,),
        scope=Scope.RANK,
        hosts=("vm",),
        detail={"evidence": [0.004, 0.002, 0.6, 0.003], "median_s": 0.0035},
    )


def _agree() -> Record:
    return Record(
        schema=VERDICT_SCHEMA,
        run_id="r",
        step=7,
        surface="layer/layers.3/forward",
        mode=Mode.EXACT,
        status=Status.AGREE,
        group=(0, 1, 2, 3),
    )


def test_straggler_line_names_writer_failure_rank_step_and_timing() -> None:
    line = attribution_line(_straggler(), rank=0)
    assert line == (
        "scout[rank 0]: straggler rank 2 at step 7 on layer/layers.3/t_M (vm): "
        "rank 2: 600.0 ms vs peer median 3.5 ms (171x)"
    )


def test_sdc_line_shows_the_differing_signature() -> None:
    rec = Record(
        schema=VERDICT_SCHEMA,
        run_id="r",
        step=3,
        surface="layer/layers.0/forward",
        mode=Mode.EXACT,
        status=Status.ATTRIBUTED,
        failure=Failure.SDC,
        group=(0, 1, 2),
        outliers=(1,),
        scope=Scope.RANK,
        detail={"evidence": ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "aaaaaaaaaaaa"]},
    )
    line = attribution_line(rec, rank=0)
    assert line is not None
    assert line.startswith("scout[rank 0]: sdc rank 1 at step 3 on layer/layers.0/forward: ")
    assert "rank 1 bbbbbbbb vs aaaaaaaa (others)" in line


def test_records_naming_no_one_stay_out_of_the_console() -> None:
    assert attribution_line(_agree(), rank=0) is None


def test_an_incident_is_said_once_not_at_every_revision(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    # A lasting straggler revises its incident every window; the console says it once.
    from dataclasses import replace

    from scout_core.incident_merge import coupled_partners
    from scout_core.records.incidents import IncidentBook, merge_window
    from scout_core.topology.mesh import MeshLayout

    ddp = coupled_partners(MeshLayout.from_order("dp", dp=4))
    book = IncidentBook("r")
    windows = [[replace(_straggler(), step=s)] for s in (7, 8, 9)]
    incidents = [book.add(merge_window(w, ddp))[0] for w in windows]
    assert [i.detail["revision"] for i in incidents] == [0, 1, 2]
    caplog.set_level(logging.WARNING, logger="scout_core")
    with EvidenceWriter(str(tmp_path), 0, run_id="r") as writer:
        for incident in incidents:
            writer.write(incident)
    lines = [r.getMessage() for r in caplog.records if r.name == "scout_core.records.console"]
    assert len(lines) == 1
    assert lines[0].startswith("scout[rank 0]: incident: straggler rank 2 at step 7")


def test_the_writer_logs_attributions_at_warning(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scout_core")
    with EvidenceWriter(str(tmp_path), 0, run_id="r") as writer:
        writer.write(_agree())
        writer.write(_straggler())
    lines = [r for r in caplog.records if r.name == "scout_core.records.console"]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert lines[0].getMessage().startswith("scout[rank 0]: straggler rank 2 at step 7")


def test_a_record_that_cannot_be_described_is_still_written(
    tmp_path: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout_core.records import console

    def broken(record: Record) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(console, "evidence_line", broken)
    log_attribution(_straggler(), rank=0)  # must not raise
    with EvidenceWriter(str(tmp_path), 0, run_id="r") as writer:
        writer.write(_straggler())
        assert writer.path.read_text().count("\n") == 1
