"""A terminating trainer leaves torchelastic an error file that names the culprit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from scout_core.observer.elastic_error import ERROR_FILE_ENV, write_error_file
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status


def _hang() -> Record:
    return Record(
        schema=VERDICT_SCHEMA,
        run_id="r",
        step=12,
        surface="progress",
        mode=Mode.EXACT,
        status=Status.ATTRIBUTED,
        failure=Failure.HANG,
        group=(0, 1, 2, 3),
        outliers=(2,),
        scope=Scope.RANK,
        hosts=("node-3",),
        detail={"reason": "rank 2 is behind at step 11"},
    )


def test_torchrun_reads_the_culprit_from_the_error_file(tmp_path: Path) -> None:
    target = tmp_path / "attempt_0" / "1" / "error.json"
    written = write_error_file([_hang()], rank=1, exit_code=86, env={ERROR_FILE_ENV: str(target)})
    assert written == target
    # What torchrun's agent does with a failed worker's file (its Root Cause section).
    failure = ProcessFailure(local_rank=1, pid=123, exitcode=86, error_file=str(target))
    assert isinstance(failure.message, dict)
    text = failure.message["message"]
    assert "on_hang=terminate, exit code 86" in text
    assert "hang rank 2 at step 12 on progress (node-3)" in text
    assert "scout[rank 1]" in text
    assert failure.timestamp > 0
    callstack = failure.message["extraInfo"]["py_callstack"]
    assert json.loads(callstack.splitlines()[-1])["outliers"] == [2]
    assert [p.name for p in target.parent.iterdir()] == ["error.json"]  # no temp file left


def test_outside_torchelastic_nothing_is_written_but_the_reason_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="scout_core")
    assert write_error_file([_hang()], rank=0, exit_code=86, env={}) is None
    assert list(tmp_path.iterdir()) == []
    assert any("hang rank 2 at step 12" in r.getMessage() for r in caplog.records)


def test_an_unwritable_error_file_is_logged_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    target = blocker / "error.json"  # a directory that is a file
    assert (
        write_error_file([_hang()], rank=0, exit_code=86, env={ERROR_FILE_ENV: str(target)}) is None
    )
