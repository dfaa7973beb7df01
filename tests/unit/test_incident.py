"""Record ids and the ``scout.incident/1`` schema, with hand-built incidents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scout_core.errors import EvidenceError
from scout_core.records.evidence import EvidenceWriter, load_report
from scout_core.records.record import (
    CHECKPOINT_SCHEMA,
    ID_LENGTH,
    INCIDENT_SCHEMA,
    SCHEMAS,
    VERDICT_SCHEMA,
    Record,
)
from scout_core.vocabulary import Failure, Mode, Scope, Status


def sdc(**overrides: Any) -> Record:
    fields: dict[str, Any] = {
        "schema": VERDICT_SCHEMA,
        "run_id": "run-1",
        "time": 1000.0,
        "step": 40,
        "surface": "layer/model.layers.3/forward",
        "mode": Mode.EXACT,
        "status": Status.ATTRIBUTED,
        "failure": Failure.SDC,
        "group": (0, 2, 4),
        "outliers": (2,),
        "scope": Scope.RANK,
        "hosts": ("node1",),
        "detail": {"evidence": ["01", "02", "01"]},
    }
    fields.update(overrides)
    return Record(**fields)


def incident(**overrides: Any) -> Record:
    detail = {
        "first_step": 40,
        "last_step": 44,
        "corroborating": [sdc().id, sdc(step=44).id],
        "explained": [sdc(group=(1, 3, 5), outliers=(), status=Status.INCONCLUSIVE).id],
        "summary": "SDC on rank 2 (node1): layer 3 forward differs at steps 40-44",
    }
    detail.update(overrides.pop("detail", {}))
    fields: dict[str, Any] = {
        "schema": INCIDENT_SCHEMA,
        "run_id": "run-1",
        "time": 1002.0,
        "step": 40,
        "surface": "layer/model.layers.3/forward",
        "failure": Failure.SDC,
        "group": (0, 1, 2, 3, 4, 5),
        "outliers": (2,),
        "scope": Scope.RANK,
        "hosts": ("node1",),
        "detail": detail,
    }
    fields.update(overrides)
    return Record(**fields)


def test_incident_schema_is_known_and_round_trips() -> None:
    assert INCIDENT_SCHEMA == "scout.incident/1"
    assert INCIDENT_SCHEMA in SCHEMAS
    record = incident()
    again = Record.from_json(record.to_json())
    assert again == record and again.id == record.id
    assert record.mode is None and record.status is None  # both optional on incidents
    assert incident(status=Status.ATTRIBUTED, mode=Mode.EXACT).status is Status.ATTRIBUTED


def test_id_is_derived_from_content_without_time() -> None:
    record = sdc()
    assert len(record.id) == ID_LENGTH
    assert int(record.id, 16) >= 0
    assert sdc(time=5.0).id == record.id  # the same decision, written at another time
    assert sdc(step=41).id != record.id
    assert sdc(detail={"evidence": ["01", "03", "01"]}).id != record.id
    assert sdc(run_id="run-2").id != record.id
    assert "id" not in record.to_dict()  # derived, never stored: old files stay readable
    # Pinned: ids are a contract between writers and readers across versions and runs.
    assert record.id == "d9e9d180be193057"


def test_id_is_the_same_in_another_process_with_another_hash_seed() -> None:
    """An id must not depend on the interpreter (string hashing is salted per process)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'tests/unit'); "
        "from test_incident import sdc; print(sdc().id)"
    )
    root = Path(__file__).resolve().parents[2]
    ids = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert ids == {sdc().id}


def test_ids_of_records_read_back_match(tmp_path: Path) -> None:
    records = [sdc(), incident(), sdc(step=44)]
    with EvidenceWriter(tmp_path, 0, run_id="run-1") as w:
        for r in records:
            w.write(r)
    report = load_report(tmp_path)
    assert sorted(r.id for r in report.records) == sorted(r.id for r in records)
    (found,) = report.incidents()
    ids = {r.id for r in report.records}
    assert set(found.detail["corroborating"]) <= ids


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"failure": None}, "needs field 'failure'"),
        ({"group": (), "outliers": ()}, "ranks involved in 'group'"),
        ({"detail": {"first_step": 39}}, "first_step 39 must equal field 'step' 40"),
        ({"detail": {"last_step": 39}}, "last_step 39 is before"),
        ({"detail": {"last_step": None}}, "detail.last_step"),
        ({"detail": {"corroborating": ["xyz"]}}, "detail.corroborating must be a list"),
        ({"detail": {"explained": "none"}}, "detail.explained must be a list"),
        ({"detail": {"summary": "two\nlines"}}, "detail.summary must be one non-empty line"),
        ({"detail": {"summary": " "}}, "detail.summary"),
        ({"action": "capture", "checkpoint_step": 1}, "belongs to scout.checkpoint/1"),
        ({"outliers": (9,)}, "not in 'group'"),
    ],
)
def test_invalid_incidents_are_refused(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(EvidenceError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        incident(**overrides)


def test_missing_detail_keys_are_named() -> None:
    data = json.loads(incident().to_json())
    del data["detail"]["summary"]
    with pytest.raises(EvidenceError, match=r"detail\.summary"):
        Record.from_dict(data)
    data = json.loads(incident().to_json())
    del data["detail"]["first_step"]
    with pytest.raises(EvidenceError, match=r"detail\.first_step"):
        Record.from_dict(data)


def test_a_group_stall_incident_may_have_no_culprit() -> None:
    stall = incident(
        failure=Failure.GROUP_STALL,
        outliers=(),
        scope=Scope.GROUP,
        hosts=(),
        surface="progress",
        detail={"summary": "group 0-5 stalled at equal progress; check the hardware"},
    )
    assert stall.outliers == ()


def test_incident_rules_apply_to_incidents_only() -> None:
    # A verdict's or gate record's detail keys stay free.
    assert sdc(detail={"summary": "two\nlines"}).detail["summary"] == "two\nlines"
    gate = Record(
        schema=CHECKPOINT_SCHEMA,
        run_id="run-1",
        step=3,
        surface="gate",
        action="promote",
        checkpoint_step=2,
        detail={"first_step": 9},
    )
    assert gate.detail == {"first_step": 9}
