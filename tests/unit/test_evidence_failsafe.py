"""The evidence writer never raises over I/O: a full, missing or read-only report_dir.

Each case first shows the fault is real (the same operation raises outside the
writer), then that the writer drops the record, counts and logs it, and carries on;
a write cut short leaves exactly one unreadable line, which a lenient reader names.
The tmpfs cases need root (mount); the injected ones run everywhere.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scout_core.records.evidence import EvidenceWriter, load_report
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status


def verdict(step: int, blob: int = 0) -> Record:
    return Record(
        schema=VERDICT_SCHEMA,
        run_id="run-1",
        time=1000.0 + step,
        step=step,
        surface="layer/layers.0/forward",
        mode=Mode.EXACT,
        status=Status.ATTRIBUTED,
        failure=Failure.SDC,
        group=(0, 1, 2),
        outliers=(1,),
        scope=Scope.RANK,
        hosts=("h",),
        detail={"blob": "x" * blob},
    )


def test_unwritable_directory_drops_and_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "report"
    blocker.write_text("a file where the report directory should be")
    with pytest.raises(OSError):  # the fault is real
        (blocker / "run-1").mkdir(parents=True)
    writer = EvidenceWriter(blocker, 0, run_id="run-1")
    with caplog.at_level("WARNING", logger="scout_core"):
        assert writer.write(verdict(1)) is False
        assert writer.write_group(verdict(2)) is False
    writer.close()
    assert (writer.written, writer.dropped) == (0, 2)
    assert isinstance(writer.last_error, OSError)
    logged = [r.getMessage() for r in caplog.records if r.name == "scout_core.records.evidence"]
    assert len(logged) == 1 and "cannot write evidence" in logged[0]  # not once per record
    assert "training goes on" in logged[0]


def test_a_write_cut_short_by_a_full_disk_costs_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = EvidenceWriter(tmp_path, 0, run_id="run-1", fsync=False)
    assert writer.write(verdict(1))
    real_write = os.write
    calls = {"n": 0}

    def full(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:40])  # part of the line got out
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    assert writer.write(verdict(2)) is False
    monkeypatch.setattr(os, "write", real_write)
    assert writer.write(verdict(3)) and writer.write(verdict(4))
    writer.close()
    report = load_report(tmp_path, strict=False)
    assert [r.step for r in report.records] == [1, 3, 4]
    assert len(report.problems) == 1 and report.problems[0].line == 2
    assert (writer.written, writer.dropped) == (3, 1)


def _mount_tmpfs(path: Path, size: str, *options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    return done.returncode == 0


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "tmpfs"
    if os.geteuid() != 0 or not _mount_tmpfs(where, "64k"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)


def test_a_real_full_tmpfs(tmpfs: Path) -> None:
    with pytest.raises(OSError):  # the fault is real: 100 KiB do not fit in 64 KiB
        (tmpfs / "fill").write_bytes(b"x" * 100_000)
    (tmpfs / "fill").unlink()
    writer = EvidenceWriter(tmpfs, 0, run_id="run-1")
    results = [writer.write(verdict(step, blob=6000)) for step in range(20)]
    writer.close()
    assert results[0] and not results[-1]
    assert writer.dropped > 0 and writer.written + writer.dropped == 20
    report = load_report(tmpfs, strict=False)
    assert len(report.records) == writer.written  # every record said written is readable


def test_a_read_only_tmpfs(tmp_path: Path) -> None:
    where = tmp_path / "ro"
    if os.geteuid() != 0 or not _mount_tmpfs(where, "64k", "ro"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        with pytest.raises(OSError):  # the fault is real, even for root
            (where / "x").write_text("x")
        writer = EvidenceWriter(where, 0, run_id="run-1")
        assert writer.write(verdict(1)) is False
        writer.close()
        assert writer.dropped == 1
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)
