"""The command line: a C3 round across local ranks, and report rendering."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scout_core.observer.spawn import die_with_parent


def c3_round(*argv: str) -> subprocess.CompletedProcess[str]:
    """``scout c3-round`` in a child that is SIGKILLed if pytest dies (its ranks die with
    it): a SIGKILLed pytest would otherwise leave the command and its ranks running."""
    return subprocess.run(
        [sys.executable, "-m", "scout_core.cli.main", "c3-round", *argv],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_c3_round_names_the_odd_rank() -> None:
    out = c3_round("--ranks", "4", "--odd-rank", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verdict: attributed, outliers [2]; identical on every rank: True" in out.stdout
    assert out.stdout.count("<- outlier") == 1


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_c3_round_without_fault_agrees() -> None:
    out = c3_round("--ranks", "3", "--odd-rank", "-1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verdict: agree, outliers []" in out.stdout


def test_report_renders_and_refuses_a_bad_directory(tmp_path: Path) -> None:
    from scout_core.cli.main import main
    from scout_core.records.evidence import EvidenceWriter
    from scout_core.records.record import CHECKPOINT_SCHEMA, VERDICT_SCHEMA, Record
    from scout_core.vocabulary import Failure, Mode, Scope, Status

    with EvidenceWriter(tmp_path, 0, run_id="t") as w:
        w.write(
            Record(
                schema=VERDICT_SCHEMA,
                run_id="t",
                step=5,
                surface="layer/layers.1/forward",
                mode=Mode.EXACT,
                status=Status.ATTRIBUTED,
                failure=Failure.SDC,
                group=(0, 2, 4),
                outliers=(2,),
                scope=Scope.RANK,
                hosts=("h2",),
            )
        )
    from scout_core.records.evidence import load_report
    from scout_core.report.render import render_records

    table = render_records(load_report(tmp_path).records)
    lines = table.splitlines()
    assert lines[0].split() == ["step", "failure", "culprit", "scope", "surface", "peers"]
    row = ["5", "sdc", "rank", "2", "rank", "layer/layers.1/forward", "[0,2,4]"]
    assert lines[1].split() == row
    with EvidenceWriter(tmp_path, 1, run_id="t") as w:
        w.write(
            Record(
                schema=CHECKPOINT_SCHEMA,
                run_id="t",
                step=4,
                surface="gate",
                mode=None,
                status=None,
                failure=None,
                group=(0, 2, 4),
                outliers=(),
                scope=Scope.JOB,
                hosts=(),
                action="capture",
                checkpoint_step=4,
            )
        )
    records = load_report(tmp_path).records
    assert "ckpt capture" not in render_records(records)  # routine: only with --all
    assert "ckpt capture" in render_records(records, include_agree=True)
    assert main(["report", str(tmp_path)]) == 1  # an SDC was attributed
    (tmp_path / "rank-2.jsonl").write_text("{not json\n")
    assert main(["report", str(tmp_path)]) == 1  # the bad file is skipped and named
    assert load_report(tmp_path, strict=False).problems[0].line == 1
    assert main(["report", str(tmp_path / "rank-2.jsonl")]) == 2  # nothing readable


def test_help_texts_carry_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from scout_core.cli.main import main

    # The module entry once in a fresh interpreter, then each command's help in-process.
    out = subprocess.run(
        [sys.executable, "-m", "scout_core", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "usage: scout" in out and "``" not in out and ":class:" not in out, out
    for argv in ([], ["demo"], ["report"], ["catalog"], ["simulate"], ["c3-round"], ["campaign"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--help"])
        out = capsys.readouterr().out
        assert exit_info.value.code == 0 and "usage: scout" in out, (argv, out)
        assert "``" not in out and ":class:" not in out, (argv, out)
