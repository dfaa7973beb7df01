"""Reading damaged report directories (issue 16 item 10): lenient skips and says, strict raises.

Each case damages a directory that also holds a good file, and checks that the lenient
reader keeps every good record and names what it skipped, while the strict reader raises
:class:`EvidenceError` (never another exception, never a hang).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scout_core.errors import EvidenceError
from scout_core.records.evidence import EvidenceWriter, load_report
from scout_core.records.reading import Report
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status


def sdc(step: int, outlier: int = 2, group: tuple[int, ...] = (0, 1, 2, 3)) -> Record:
    return Record(
        schema=VERDICT_SCHEMA,
        run_id="run-1",
        time=1000.0 + step,
        step=step,
        surface="layer/layers.1/forward",
        mode=Mode.EXACT,
        status=Status.ATTRIBUTED,
        failure=Failure.SDC,
        group=group,
        outliers=(outlier,),
        scope=Scope.RANK,
        hosts=("h",),
    )


def good_dir(tmp_path: Path) -> Path:
    """Ranks 0 and 1 each wrote two records (two peer groups, DP x TP style), in the
    flat layout of reports written before runs had directories (rank files at the top)."""
    for rank, group in ((0, (0, 2, 4)), (1, (1, 3, 5))):
        records = [sdc(3, outlier=group[1], group=group), sdc(5, outlier=group[2], group=group)]
        text = "".join(r.to_json() + "\n" for r in records)
        (tmp_path / f"rank-{rank}.jsonl").write_text(text, encoding="utf-8")
    return tmp_path


def lenient(path: Path) -> Report:
    return load_report(path, strict=False)


def only_problem(report: Report) -> str:
    assert len(report.problems) == 1, report.problems
    return str(report.problems[0])


def test_a_clean_directory_has_no_problems(tmp_path: Path) -> None:
    report = lenient(good_dir(tmp_path))
    assert report.problems == ()
    assert len(report.records) == 4
    assert [p.name for p in report.files] == ["rank-0.jsonl", "rank-1.jsonl"]
    assert report.ranks_without_file() == (2, 3, 4, 5)  # peers that wrote nothing
    assert load_report(tmp_path) == report  # both modes agree on good input


def test_truncated_last_line_is_reported_and_the_rest_read(tmp_path: Path) -> None:
    good_dir(tmp_path)
    path = tmp_path / "rank-1.jsonl"
    text = path.read_bytes()
    path.write_bytes(text + sdc(7, outlier=3, group=(1, 3, 5)).to_json().encode()[:50])
    report = lenient(tmp_path)
    assert len(report.records) == 4
    message = only_problem(report)
    assert message.startswith(f"{path}:3: truncated last line")
    with pytest.raises(EvidenceError, match=r"rank-1\.jsonl:3: truncated last line"):
        load_report(tmp_path)


def test_a_complete_record_without_final_newline_is_kept(tmp_path: Path) -> None:
    (tmp_path / "rank-0.jsonl").write_text(sdc(3).to_json())
    assert len(load_report(tmp_path).records) == 1
    assert lenient(tmp_path).problems == ()


def test_missing_rank_file_is_named(tmp_path: Path) -> None:
    good_dir(tmp_path)
    (tmp_path / "rank-1.jsonl").unlink()
    report = lenient(tmp_path)
    assert len(report.records) == 2
    assert report.problems == ()
    assert report.ranks_without_file() == (2, 4)  # rank 1 is no longer named by any record
    # A job-wide record names every rank, so a missing writer shows:
    with EvidenceWriter(tmp_path, 0, run_id="run-1") as w:
        w.write(sdc(6, outlier=1, group=(0, 1, 2, 3, 4, 5)))
    assert 1 in lenient(tmp_path).ranks_without_file()


def test_invalid_utf8_line_is_skipped(tmp_path: Path) -> None:
    good_dir(tmp_path)
    path = tmp_path / "rank-0.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"schema": "\xff\xfe"}\n' + lines[1])
    report = lenient(tmp_path)
    assert len(report.records) == 4
    assert "rank-0.jsonl:2: not valid UTF-8" in only_problem(report)
    with pytest.raises(EvidenceError, match="not valid UTF-8"):
        load_report(tmp_path)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_json_is_skipped(tmp_path: Path, depth: int) -> None:
    good_dir(tmp_path)
    nested = (
        sdc(9).to_json().replace('"detail":{}', '"detail":{"x":' + "[" * depth + "]" * depth + "}")
    )
    assert nested != sdc(9).to_json()
    with (tmp_path / "rank-0.jsonl").open("a") as f:
        f.write(nested + "\n")
    report = lenient(tmp_path)
    assert len(report.records) == 4 + (depth == 100)  # shallow nesting is a valid detail
    if depth == 100:
        assert report.problems == ()
    else:
        assert "nested too deeply" in only_problem(report)
        with pytest.raises(EvidenceError, match="nested too deeply"):
            load_report(tmp_path)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.symlink_to(p.parent / "nowhere"), "cannot read"),
        (os.mkfifo, "is a FIFO"),
    ],
    ids=["directory", "dangling-symlink", "fifo"],
)
def test_non_regular_rank_files_are_skipped_without_opening(
    tmp_path: Path, make: Callable[[Path], Any], kind: str
) -> None:
    good_dir(tmp_path)
    odd = tmp_path / "rank-7.jsonl"
    make(odd)
    out: list[Any] = []
    # A FIFO opened for reading would block until a writer came: run the read in a
    # thread and fail (rather than hang the suite) if it does not return.
    worker = threading.Thread(target=lambda: out.append(lenient(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "load_report hung on a non-regular rank file"
    (report,) = out
    assert len(report.records) == 4
    message = only_problem(report)
    assert message.startswith(f"{odd}: {kind}")
    with pytest.raises(EvidenceError, match=kind):
        load_report(tmp_path)


def test_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    good_dir(elsewhere)
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    (report_dir / "rank-0.jsonl").symlink_to(elsewhere / "rank-0.jsonl")
    assert len(load_report(report_dir).records) == 2


def test_leading_zero_is_not_the_same_rank(tmp_path: Path) -> None:
    good_dir(tmp_path)
    with EvidenceWriter(tmp_path, 1, run_id="run-1") as w:
        w.write(sdc(8, outlier=5, group=(1, 3, 5)))
    (tmp_path / "rank-01.jsonl").write_text(sdc(9, outlier=3, group=(1, 3, 5)).to_json() + "\n")
    report = lenient(tmp_path)
    assert [r.step for r in report.by_rank[1]] == [3, 5, 8]  # only rank-1.jsonl is rank 1's
    assert 9 not in {r.step for r in report.records}
    message = only_problem(report)
    assert "rank-01.jsonl: odd name: rank 1 writes rank-1.jsonl" in message
    with pytest.raises(EvidenceError, match=r"rank-01\.jsonl: odd name"):
        load_report(tmp_path)


def test_unparseable_names_and_bad_records_are_listed_in_order(tmp_path: Path) -> None:
    good_dir(tmp_path)
    (tmp_path / "rank-x.jsonl").write_text("")
    with (tmp_path / "rank-1.jsonl").open("a") as f:
        f.write('{"schema": "scout.verdict/9"}\n\n[1, 2]\n')
    report = lenient(tmp_path)
    assert len(report.records) == 4
    texts = [str(p) for p in report.problems]  # names are checked first, then lines
    assert texts[0].endswith("rank-x.jsonl: not a rank file (rank-<global rank>.jsonl)")
    assert texts[1].endswith(
        "rank-1.jsonl:3: unknown schema 'scout.verdict/9'; known: "
        "scout.verdict/1, scout.checkpoint/1, scout.incident/1"
    )
    assert texts[2].endswith("rank-1.jsonl:5: a record must be a JSON object, got list")
    assert len(texts) == 3


@pytest.mark.parametrize(
    "line",
    [
        '{"time": 1e999}',
        "NaN",
        '{"schema":"scout.verdict/1","run_id":"r","time":1' + "0" * 400 + ',"step":1,'
        '"surface":"s","mode":"exact","status":"agree","failure":null,"group":[0],"outliers":[],'
        '"scope":null,"hosts":[],"detail":{},"action":null,"selected":null,"checkpoint_step":null}',
        '{"schema":"scout.verdict/1","run_id":"r","time":1,"step":1,"surface":"s",'
        '"mode":["x"],"status":"agree","failure":null,"group":[0],"outliers":[],"scope":null,'
        '"hosts":[],"detail":{},"action":null,"selected":null,"checkpoint_step":null}',
    ],
    ids=["infinity", "nan", "huge-int", "unhashable-enum"],
)
def test_malformed_values_are_evidence_errors(tmp_path: Path, line: str) -> None:
    (tmp_path / "rank-0.jsonl").write_text(line + "\n")
    with pytest.raises(EvidenceError):
        load_report(tmp_path)
    assert len(lenient(tmp_path).problems) == 1


def test_a_single_file_is_accepted(tmp_path: Path) -> None:
    good_dir(tmp_path)
    report = load_report(tmp_path / "rank-1.jsonl")
    assert report.directory == tmp_path
    assert list(report.by_rank) == [1]
    assert len(report.records) == 2
    copy = tmp_path / "from-node-3.jsonl"  # any name: the file was named explicitly
    copy.write_bytes((tmp_path / "rank-0.jsonl").read_bytes())
    single = load_report(copy)
    assert len(single.records) == 2 and dict(single.by_rank) == {}


def test_runs_in_subdirectories_and_the_flat_layout_are_read_together(tmp_path: Path) -> None:
    good_dir(tmp_path)  # a report written before runs had directories: run-1, flat
    for run, step in (("scout-20260101-000000-0000000000aa", 7), ("b-run", 9)):
        with EvidenceWriter(tmp_path, 0, run_id=run) as w:
            assert w.path == tmp_path / run / "rank-0.jsonl"
            w.write(dataclasses.replace(sdc(step), run_id=run))
    (tmp_path / "pictures").mkdir()  # a directory without rank files is no run
    (tmp_path / "b-run" / "notes.txt").write_text("other files are ignored")
    report = load_report(tmp_path)
    assert report.runs() == ("run-1", "scout-20260101-000000-0000000000aa", "b-run")
    assert [r.step for r in report.by_rank[0]] == [3, 5, 9, 7]  # flat, then runs by name
    assert len(report.files) == 4 and report.problems == ()
    one = load_report(tmp_path / "b-run")  # one run's directory on its own
    assert one.runs() == ("b-run",) and len(one.records) == 1
    (tmp_path / "b-run" / "rank-02.jsonl").write_text("")
    assert "b-run/rank-02.jsonl: odd name" in only_problem(lenient(tmp_path))


def test_paths_that_are_not_reports(tmp_path: Path) -> None:
    with pytest.raises(EvidenceError, match="no such report directory or file"):
        load_report(tmp_path / "absent", strict=False)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(EvidenceError, match="not a report directory or a regular file"):
        load_report(fifo, strict=False)
    empty = lenient(tmp_path)
    assert empty.files == () and empty.records == ()
