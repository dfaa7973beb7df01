"""``scout report`` on hand-built directories: sections, filters, runs, JSON, exit codes, pipes.

The pictures and the HTML page on a real faulty run are checked in
``tests/distributed/test_report_demo.py``; here every record is built by hand so each
column can be checked against a known value.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout_core.cli.main import main
from scout_core.records.evidence import EvidenceWriter
from scout_core.records.record import CHECKPOINT_SCHEMA, INCIDENT_SCHEMA, VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status

T0 = 1_760_000_000.0
GROUP = (0, 2, 4, 6)


def verdict(step: int, t: float, **overrides: Any) -> Record:
    fields: dict[str, Any] = {
        "schema": VERDICT_SCHEMA,
        "run_id": "run-a",
        "time": T0 + t,
        "step": step,
        "surface": "layer/layers.1/forward",
        "mode": Mode.EXACT,
        "status": Status.ATTRIBUTED,
        "failure": Failure.SDC,
        "group": GROUP,
        "outliers": (4,),
        "scope": Scope.RANK,
        "hosts": ("node1",),
        "detail": {
            "evidence": [
                "aaaaaaaaaaaaaaaa",
                "aaaaaaaaaaaaaaaa",
                "bbbbbbbbbbbbbbbb",
                "aaaaaaaaaaaaaaaa",
            ]
        },
    }
    fields.update(overrides)
    return Record(**fields)


def gate(step: int, t: float, action: str, ckpt: int | None, **overrides: Any) -> Record:
    return Record(
        schema=CHECKPOINT_SCHEMA,
        run_id=overrides.pop("run_id", "run-a"),
        time=T0 + t,
        step=step,
        surface="gate",
        group=overrides.pop("group", tuple(range(8))),
        scope=Scope.JOB,
        action=action,
        checkpoint_step=ckpt,
        detail={"reason": f"{action} at {step}"},
        **overrides,
    )


def straggler(step: int, t: float) -> Record:
    return verdict(
        step,
        t,
        surface="layer/layers.1/t_M",
        mode=Mode.STATISTICAL,
        failure=Failure.STRAGGLER,
        group=(1, 3, 5, 7),
        outliers=(5,),
        hosts=("node2",),
        detail={"evidence": [0.010, 0.011, 0.300, 0.009], "median_s": 0.0105, "rounds": 2},
    )


def write_run(directory: Path) -> dict[str, Record]:
    """Run ``run-a``: clean steps, an SDC on rank 4 (two surfaces), a straggler, an incident."""
    sdc_fwd = verdict(5, 5.5)
    sdc_grad = verdict(5, 5.6, surface="layer/layers.1/input_grad")
    slow = straggler(7, 7.5)
    partner = verdict(
        5,
        5.7,
        group=(1, 3, 5, 7),
        outliers=(),
        status=Status.INCONCLUSIVE,
        failure=None,
        scope=Scope.GROUP,
        hosts=(),
        detail={"reason": "local shards agree but gathered parameters differ"},
    )
    incident = Record(
        schema=INCIDENT_SCHEMA,
        run_id="run-a",
        time=T0 + 6.0,
        step=5,
        surface="layer/layers.1/forward",
        failure=Failure.SDC,
        group=tuple(range(8)),
        outliers=(4,),
        scope=Scope.RANK,
        hosts=("node1",),
        detail={
            "first_step": 5,
            "last_step": 5,
            "corroborating": [sdc_fwd.id, sdc_grad.id],
            "explained": [partner.id],
            "summary": "SDC on rank 4 (node1): layers.1 forward and input grad differ",
        },
    )
    with EvidenceWriter(directory, 0, run_id="run-a") as w:
        for step in range(5):
            w.write(gate(step, step + 0.9, "capture", step))
        w.write(gate(3, 3.95, "candidate", 3))
        w.write(gate(4, 4.95, "promote", 3))
        w.write(sdc_fwd)
        w.write(sdc_grad)
        w.write(incident)
        w.write(gate(5, 6.1, "retrieve", 3, selected="verified", failure=Failure.SDC))
        w.write(verdict(6, 6.8, status=Status.AGREE, failure=None, outliers=(), hosts=()))
    with EvidenceWriter(directory, 1, run_id="run-a") as w:
        w.write(partner)
        w.write(slow)
    return {
        "sdc": sdc_fwd,
        "grad": sdc_grad,
        "partner": partner,
        "incident": incident,
        "slow": slow,
    }


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def report_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, _ = report(capsys, *args, "--json")
    data: dict[str, Any] = json.loads(out)
    assert data["exit_code"] == code
    return data


def test_timeline_sections_columns_and_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = write_run(tmp_path)
    code, out, _ = report(capsys, str(tmp_path))
    assert code == 1  # something was attributed
    order = [
        out.index(title)
        for title in ("Incidents (1)", "Verdicts (4)", "Checkpoint gate (2)", "Restore (1)")
    ]
    assert order == sorted(order)  # incidents first, then verdicts, gate, restore
    assert "SDC on rank 4 (node1): layers.1 forward and input grad differ" in out
    assert "differs: layer/layers.1/forward, layer/layers.1/input_grad" in out
    assert "rank 4 bbbbbbbb vs aaaaaaaa (others)" in out
    assert "rank 5: 300.0 ms vs peer median 10.5 ms (29x)" in out
    assert f"[incident {made['incident'].id}]" in out  # verdicts the incident cites point to it
    assert "verified step 3" in out  # the restore's choice
    assert "capture" not in out  # routine captures only with --all
    assert "| run " not in out  # one run: no run column
    lines = {
        line.split("|")[3].strip(): line
        for line in out.splitlines()
        if line.startswith("| ") and "sdc" in line
    }
    assert "sdc" in lines


def test_time_to_verdict(tmp_path: Path) -> None:
    from scout_core.records.reading import load_report
    from scout_core.report.timeline import build_timeline

    made = write_run(tmp_path)
    late = straggler(12, 12.5)
    with EvidenceWriter(tmp_path, 1, run_id="run-a") as w:
        w.write(late)
    rows = {row.record.id: row for row in build_timeline(load_report(tmp_path)).rows}
    # From the run's last decision at the previous step (the capture at 4.95) to the verdict.
    assert rows[made["sdc"].id].ttv_s == pytest.approx(5.5 - 4.95)
    assert rows[made["slow"].id].ttv_s == pytest.approx(7.5 - 6.8)  # the agree round at 6
    assert rows[late.id].ttv_s is None  # nothing recorded at step 11: no bound
    # An incident: from the first record it cites.
    assert rows[made["incident"].id].ttv_s == pytest.approx(6.0 - 5.5)
    # An observer verdict: the longest silence of its culprits.
    hang = verdict(
        9,
        9.0,
        surface="progress",
        failure=Failure.HANG,
        outliers=(2,),
        detail={"quiet_s": {"0": 0.1, "2": 31.5, "4": 0.2, "6": 0.1}},
    )
    with EvidenceWriter(tmp_path, 0, run_id="run-a") as w:
        w.write(hang)
    rows = {row.record.id: row for row in build_timeline(load_report(tmp_path)).rows}
    assert rows[hang.id].ttv_s == 31.5


def test_all_and_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path)
    data = report_json(capsys, str(tmp_path), "--all")
    assert [r["what"] for r in data["sections"]["gate"]].count("capture") == 5
    assert any(r["record"]["status"] == "agree" for r in data["sections"]["verdicts"])
    data = report_json(capsys, str(tmp_path), "--failure", "straggler")
    assert data["sections"]["verdicts"][0]["record"]["outliers"] == [5]
    assert sum(len(v) for v in data["sections"].values()) == 1
    data = report_json(capsys, str(tmp_path), "--rank", "3")  # in the odd group only
    kept = [r["record"]["group"] for v in data["sections"].values() for r in v]
    assert kept and all(3 in g for g in kept)
    assert data["selection"]["ranks"] == [3]
    code, out, _ = report(capsys, str(tmp_path), "--failure", "hang")
    assert code == 0
    assert "no failures recorded (in the selection)" in out


def test_runs_appended_to_one_directory_are_told_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    with EvidenceWriter(tmp_path, 0, run_id="run-b") as w:
        w.write(gate(0, 100.0, "capture", 0, run_id="run-b"))
        w.write(gate(1, 101.0, "promote", 0, run_id="run-b"))
    code, out, _ = report(capsys, str(tmp_path))
    assert code == 1
    assert "runs: run-a, run-b" in out
    assert "| run " in out  # two runs: a run column
    data = report_json(capsys, str(tmp_path), "--run-id", "run-b")
    assert data["exit_code"] == 0  # run-b reported no failure
    assert [r["record"]["run_id"] for v in data["sections"].values() for r in v] == ["run-b"]
    assert [r["run_id"] for r in data["runs"]] == ["run-a", "run-b"]
    code, _, err = report(capsys, str(tmp_path), "--run-id", "run-z")
    assert code == 2
    assert "no run 'run-z'" in err and "run-a, run-b" in err


def test_json_rows_carry_ids_and_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = write_run(tmp_path)
    data = report_json(capsys, str(tmp_path))
    # The incident, two SDC verdicts and the straggler; the partner group's inconclusive
    # round names no failure.
    assert data["version"] == 1 and data["findings"] == 4 and data["exit_code"] == 1
    (inc,) = data["sections"]["incidents"]
    assert inc["id"] == made["incident"].id
    assert Record.from_dict(inc["record"]) == made["incident"]
    assert data["problems"] == []
    assert data["ranks_without_file"] == [2, 3, 4, 5, 6, 7]


def test_a_file_is_accepted_and_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    code, out, _ = report(capsys, str(tmp_path / "run-a" / "rank-1.jsonl"))
    assert code == 1 and "rank 5: 300.0 ms" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = report(capsys, str(empty))
    assert code == 2 and out == ""
    assert "no rank files" in err
    code, _, err = report(capsys, str(tmp_path / "absent"))
    assert code == 2 and "no such report directory or file" in err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rank-0.jsonl").write_text("{not json\n")
    code, _, err = report(capsys, str(broken))
    assert code == 2 and "no readable record" in err and "rank-0.jsonl:1" in err


def test_a_clean_run_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with EvidenceWriter(tmp_path, 0, run_id="run-a") as w:
        w.write(gate(0, 0.5, "capture", 0))
        w.write(verdict(1, 1.5, status=Status.AGREE, failure=None, outliers=(), hosts=()))
    code, out, _ = report(capsys, str(tmp_path))
    assert code == 0
    assert "no failures recorded" in out


def test_damaged_directory_is_rendered_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    with (tmp_path / "run-a" / "rank-1.jsonl").open("ab") as f:
        f.write(b'{"schema":"scout.verdict/1","run_id":"run-a","ti')  # a full disk's last line
    (tmp_path / "run-a" / "rank-03.jsonl").write_text("")
    code, out, _ = report(capsys, str(tmp_path))
    assert code == 1
    assert "rank 5: 300.0 ms" in out  # rank 1's good lines are still shown
    assert "skipped (2):" in out
    assert "rank-03.jsonl: odd name: rank 3 writes rank-3.jsonl" in out
    assert "rank-1.jsonl:3: truncated last line" in out
    data = report_json(capsys, str(tmp_path))
    assert [p["line"] for p in data["problems"]] == [None, 3]


def test_piping_into_head_ends_quietly(tmp_path: Path) -> None:
    with EvidenceWriter(tmp_path, 0, run_id="run-a", fsync=False) as w:
        for step in range(3000):  # far more than a pipe buffer
            w.write(gate(step, float(step), "capture", step))
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            f"{sys.executable} -m scout_core.cli report {tmp_path} --all {' '.join(extra)}"
            " | head -n 2; exit ${PIPESTATUS[0]}",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
        assert len(proc.stdout.splitlines()) == 2


def test_the_documented_pictures_have_the_documented_sizes() -> None:
    from scout_core.report.figures import SIZES

    images = Path(__file__).resolve().parents[2] / "docs" / "images"
    for name, size in SIZES.items():
        data = (images / f"report-{name}").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == size


@pytest.mark.parametrize(
    "argv",
    [["--steps", "8"], ["--sdc-step", "0"], ["--steps", "12", "--slow-step", "10"]],
)
def test_demo_refuses_faults_outside_the_run(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from scout_core.cli.demo import main as demo_main

    with pytest.raises(SystemExit) as info:
        demo_main(argv)  # refused before any rank is spawned
    assert info.value.code == 2
    assert "the faults must fall inside the run" in capsys.readouterr().err


def test_pictures_of_a_large_long_job_keep_their_size(tmp_path: Path) -> None:
    from scout_core.records.reading import load_report
    from scout_core.report.figures import SIZES, render_figures
    from scout_core.report.timeline import build_timeline

    world = tuple(range(4096))
    with EvidenceWriter(tmp_path, 0, run_id="run-a", fsync=False) as w:
        for step in range(0, 3000, 100):
            w.write(gate(step, float(step), "capture", step, group=world))
        w.write(verdict(1200, 1200.5, group=tuple(range(7, 4096, 32)), outliers=(1031,)))
    figures = render_figures(build_timeline(load_report(tmp_path)))
    assert set(figures) == {"heatmap.png", "gate.png"}  # no straggler round: no third picture
    for name, data in figures.items():
        assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == SIZES[
            name
        ]
