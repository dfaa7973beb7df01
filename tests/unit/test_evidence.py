"""Unit tests for scout_core.records.evidence: validation, JSON, the writer, report loading."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from scout_core.errors import EvidenceError
from scout_core.records.evidence import EvidenceWriter, load_report
from scout_core.records.record import CHECKPOINT_SCHEMA, INCIDENT_SCHEMA, VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status


def verdict(**overrides: Any) -> Record:
    fields: dict[str, Any] = {
        "schema": VERDICT_SCHEMA,
        "run_id": "run-1",
        "time": 1000.0,
        "step": 40,
        "surface": "layer/model.layers.3/forward",
        "mode": Mode.EXACT,
        "status": Status.ATTRIBUTED,
        "failure": Failure.SDC,
        "group": (4, 0, 2),
        "outliers": (2,),
        "scope": Scope.RANK,
        "hosts": ("node1",),
        "detail": {"signatures": ["0x1", "0x1", "0x2"], "variant": 10.0},
    }
    fields.update(overrides)
    return Record(**fields)


def checkpoint(**overrides: Any) -> Record:
    fields: dict[str, Any] = {
        "schema": CHECKPOINT_SCHEMA,
        "run_id": "run-1",
        "time": 1001.0,
        "step": 42,
        "surface": "gate",
        "action": "promote",
        "checkpoint_step": 40,
    }
    fields.update(overrides)
    return Record(**fields)


# -- records ---------------------------------------------------------------------------


def test_to_json_is_one_sorted_line_with_enum_values() -> None:
    line = verdict().to_json()
    assert "\n" not in line
    data = json.loads(line)
    assert list(data) == sorted(data)
    assert data["mode"] == "exact"
    assert data["status"] == "attributed"
    assert data["failure"] == "sdc"
    assert data["scope"] == "rank"
    assert data["group"] == [4, 0, 2]
    assert data["action"] is None and data["checkpoint_step"] is None


@pytest.mark.parametrize("make", [verdict, checkpoint])
def test_json_round_trip_is_exact(make: Any) -> None:
    record = make()
    again = Record.from_json(record.to_json())
    assert again == record
    assert again.to_json() == record.to_json()


def test_strings_are_coerced_to_enums_and_lists_to_tuples() -> None:
    record = verdict(mode="statistical", status="agree", failure=None, outliers=[], scope=None)
    assert record.mode is Mode.STATISTICAL
    assert record.status is Status.AGREE
    assert isinstance(record.group, tuple)
    assert isinstance(record.time, float)


def test_time_defaults_to_now() -> None:
    import time

    before = time.time()
    record = Record(
        schema=VERDICT_SCHEMA,
        run_id="r",
        step=0,
        surface="progress",
        mode=Mode.EXACT,
        status=Status.AGREE,
    )
    assert before <= record.time <= time.time()


def test_detail_is_normalised_to_plain_json() -> None:
    record = verdict(detail={"timings": (0.1, 0.2), "nested": {"k": [1]}})
    assert record.detail == {"timings": [0.1, 0.2], "nested": {"k": [1]}}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"schema": "scout.verdict/2"}, "unknown schema 'scout.verdict/2'"),
        ({"run_id": ""}, "'run_id'"),
        ({"step": -1}, "'step'"),
        ({"step": True}, "'step'"),
        ({"step": 1.0}, "'step'"),
        ({"surface": ""}, "'surface'"),
        ({"time": float("nan")}, "'time'"),
        ({"time": "now"}, "'time'"),
        ({"mode": None}, "needs field 'mode'"),
        ({"status": None}, "needs field 'status'"),
        ({"mode": "fuzzy"}, "'mode' must be one of exact, statistical"),
        ({"failure": "oops"}, "'failure' must be one of sdc, straggler"),
        ({"scope": "rack"}, "'scope' must be one of rank, group, machine, job"),
        ({"outliers": (7,)}, "ranks [7] that are not in 'group'"),
        ({"group": (0, 0, 2)}, "repeats a rank"),
        ({"group": (0, -1, 2)}, "'group'"),
        ({"outliers": ()}, "only 'attributed' names outliers"),
        ({"status": Status.AGREE}, "only 'attributed' names outliers"),
        ({"status": Status.INCONCLUSIVE}, "only 'attributed' names outliers"),
        ({"hosts": "node1"}, "'hosts'"),
        ({"detail": {"x": float("nan")}}, "'detail' is not JSON-safe"),
        ({"detail": {"x": object()}}, "'detail' is not JSON-safe"),
        ({"detail": {1: "x"}}, "string keys"),
        ({"action": "promote", "checkpoint_step": 3}, "belongs to scout.checkpoint/1"),
        ({"checkpoint_step": 3}, "'checkpoint_step' belongs to"),
    ],
)
def test_invalid_verdicts_are_refused(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(EvidenceError) as info:
        verdict(**overrides)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"action": None}, "needs field 'action' (one of capture, candidate, promote, retrieve)"),
        ({"action": "discard"}, "'action' must be one of capture, candidate, promote, retrieve"),
        ({"selected": "oldest"}, "'selected' must be one of latest, verified"),
        ({"action": "retrieve", "selected": None}, "needs field 'selected'"),
        ({"checkpoint_step": None}, "'promote' record needs field 'checkpoint_step'"),
        ({"checkpoint_step": -2}, "'checkpoint_step'"),
    ],
)
def test_invalid_checkpoint_records_are_refused(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(EvidenceError) as info:
        checkpoint(**overrides)
    assert fragment in str(info.value)


def test_checkpoint_records_may_carry_a_verdict_context() -> None:
    record = checkpoint(
        action="retrieve", selected="verified", checkpoint_step=None, failure="sdc", group=(0, 1)
    )
    assert record.selected == "verified" and record.failure is Failure.SDC
    assert Record.from_json(record.to_json()) == record


def test_from_json_rejects_missing_unknown_and_malformed() -> None:
    data = json.loads(verdict().to_json())
    del data["scope"]
    with pytest.raises(EvidenceError, match="missing field 'scope'"):
        Record.from_dict(data)
    data = json.loads(verdict().to_json())
    data["colour"] = "red"
    with pytest.raises(EvidenceError, match="unknown field 'colour'"):
        Record.from_dict(data)
    data = json.loads(verdict().to_json())
    data["schema"] = "scout.other/1"
    with pytest.raises(EvidenceError, match=r"unknown schema 'scout\.other/1'"):
        Record.from_dict(data)
    with pytest.raises(EvidenceError, match="not valid JSON"):
        Record.from_json('{"schema": ')
    with pytest.raises(EvidenceError, match="must be a JSON object"):
        Record.from_json("[1, 2]")
    nan_line = verdict().to_json().replace('"variant":10.0', '"variant":NaN')
    with pytest.raises(EvidenceError, match="NaN is not valid"):
        Record.from_json(nan_line)


# -- writer ----------------------------------------------------------------------------


def test_writer_appends_lines_and_creates_dirs(tmp_path: Path) -> None:
    report = tmp_path / "deep" / "report"
    with EvidenceWriter(report, 2, run_id="run-1") as writer:
        assert not writer.path.exists()  # lazily opened: nothing decided, no file
        writer.write(verdict())
        writer.write(checkpoint())
        # Readable from another handle before close: nothing waits in a buffer.
        lines = (report / "run-1" / "rank-2.jsonl").read_text().splitlines()
        assert [Record.from_json(line) for line in lines] == [verdict(), checkpoint()]
    with pytest.raises(ValueError, match="closed"):
        writer.write(verdict())
    writer.close()  # twice is harmless


def test_writer_refuses_a_foreign_run_id(tmp_path: Path) -> None:
    with (
        EvidenceWriter(tmp_path, 0, run_id="run-2") as writer,
        pytest.raises(EvidenceError, match="does not match"),
    ):
        writer.write(verdict())


def test_write_group_writes_once_by_the_lowest_rank(tmp_path: Path) -> None:
    record = verdict()  # group (4, 0, 2)
    wrote = {}
    for rank in (4, 0, 2):
        with EvidenceWriter(tmp_path, rank, run_id="run-1") as writer:
            wrote[rank] = writer.write_group(record)
    assert wrote == {4: False, 0: True, 2: False}
    assert sorted(p.name for p in (tmp_path / "run-1").iterdir()) == ["rank-0.jsonl"]
    with (
        EvidenceWriter(tmp_path, 9, run_id="run-1") as writer,
        pytest.raises(EvidenceError, match="rank 9 is not in"),
    ):
        writer.write_group(record)


def test_writer_is_thread_safe(tmp_path: Path) -> None:
    writer = EvidenceWriter(tmp_path, 0, run_id="run-1", fsync=False)
    big = {"blob": "x" * 20000}  # larger than a pipe buffer, so interleaving would show

    def work(thread: int) -> None:
        for i in range(50):
            writer.write(verdict(step=thread * 1000 + i, detail=big))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    records = load_report(tmp_path).by_rank[0]
    assert sorted(r.step for r in records) == sorted(
        t * 1000 + i for t in range(4) for i in range(50)
    )


def test_record_survives_a_crash_right_after_write(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from scout_core.records.evidence import EvidenceWriter\n"
        "from scout_core.records.record import Record, VERDICT_SCHEMA\n"
        "w = EvidenceWriter(sys.argv[1], 3, run_id='crash')\n"
        "w.write(Record(schema=VERDICT_SCHEMA, run_id='crash', time=5.0, step=7,\n"
        "               surface='progress', mode='exact', status='agree'))\n"
        "os._exit(17)  # no close, no interpreter shutdown, no buffer flush\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], timeout=60, check=False, capture_output=True
    )
    assert proc.returncode == 17, proc.stderr.decode()
    (record,) = load_report(tmp_path).by_rank[3]
    assert (record.run_id, record.step, record.status) == ("crash", 7, Status.AGREE)


# -- reading ---------------------------------------------------------------------------


def test_load_report_sorts_and_filters(tmp_path: Path) -> None:
    straggler = verdict(
        time=1000.0,
        mode=Mode.STATISTICAL,
        failure=Failure.STRAGGLER,
        group=(1, 3, 5),
        outliers=(5,),
        surface="layer/model.layers.0/forward/time",
    )
    agree = verdict(
        time=999.0, status=Status.AGREE, failure=None, outliers=(), scope=None, hosts=()
    )
    with EvidenceWriter(tmp_path, 1, run_id="run-1") as w1:
        w1.write(straggler)
        w1.write(checkpoint(time=1002.0))
    with EvidenceWriter(tmp_path, 0, run_id="run-1") as w0:
        w0.write(verdict(time=1000.0))
        w0.write(agree)
    (tmp_path / "notes.txt").write_text("ignored: not a rank file")

    report = load_report(tmp_path)
    # time first, then the rank that wrote it; file order within a rank is kept.
    assert [r.time for r in report.records] == [999.0, 1000.0, 1000.0, 1002.0]
    assert report.records[1].failure is Failure.SDC  # rank 0 before rank 1 at t=1000
    assert report.records[2].failure is Failure.STRAGGLER
    assert list(report.by_rank) == [0, 1]
    assert [r.time for r in report.by_rank[0]] == [1000.0, 999.0]
    assert len(report.verdicts()) == 3
    assert report.verdicts(failure="straggler") == (straggler,)
    assert report.verdicts(failure=Failure.SDC) == (verdict(time=1000.0),)
    assert [r.outliers for r in report.attributed()] == [(2,), (5,)]
    assert report.checkpoints() == (checkpoint(time=1002.0),)


def test_load_report_names_file_and_line_of_a_bad_record(tmp_path: Path) -> None:
    good = verdict().to_json()
    bad = json.loads(good)
    bad["outliers"] = [99]
    (tmp_path / "rank-4.jsonl").write_text(f"{good}\n\n{json.dumps(bad)}\n")
    with pytest.raises(EvidenceError) as info:
        load_report(tmp_path)
    message = str(info.value)
    assert "rank-4.jsonl:3:" in message
    assert "[99]" in message
    (tmp_path / "rank-4.jsonl").write_text(f"{good}\n{good[:40]}\n")
    with pytest.raises(EvidenceError, match=r"rank-4\.jsonl:2: not valid JSON"):
        load_report(tmp_path)


def test_load_report_edge_cases(tmp_path: Path) -> None:
    with pytest.raises(EvidenceError, match="no such report directory"):
        load_report(tmp_path / "absent")
    empty = load_report(tmp_path)
    assert empty.records == () and dict(empty.by_rank) == {}
    (tmp_path / "rank-x.jsonl").write_text("")
    with pytest.raises(EvidenceError, match="not a rank file"):
        load_report(tmp_path)


# -- docs ------------------------------------------------------------------------------


def test_evidence_doc_samples_parse_and_every_field_is_described() -> None:
    from dataclasses import fields

    text = (Path(__file__).resolve().parents[2] / "docs" / "evidence.md").read_text("utf-8")
    samples = [line for line in text.splitlines() if line.startswith('{"action"')]
    records = [Record.from_json(line) for line in samples]
    assert [r.schema for r in records] == [VERDICT_SCHEMA, CHECKPOINT_SCHEMA, INCIDENT_SCHEMA]
    assert [r.to_json() for r in records] == samples  # pasted verbatim from to_json
    verdict_id = records[0].id
    assert f"The verdict sample above has id `{verdict_id}`." in text
    assert records[2].detail["corroborating"] == [verdict_id]
    for f in fields(Record):
        assert f"| `{f.name}` |" in text, f.name
