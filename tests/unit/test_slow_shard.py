"""scripts/slow_shard.py: shards 1/N .. N/N run every slow test once; nothing else moves.

Each case runs a small pytest session of its own in a subprocess, loading the plugin
as scripts/test.sh does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SUITE = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
@pytest.mark.parametrize("n", range(12))
def test_slow(n):
    pass

@pytest.mark.slow
@pytest.mark.parametrize("n", [pytest.param(1, id="one-seed2026339")])
def test_seeded(n):
    pass
"""


def _collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_suite.py").write_text(_SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    return subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-p", "scripts.slow_shard", "-q", "--collect-only"),
            *args,
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _ids(out: str) -> list[str]:
    return [line.split("::", 1)[1] for line in out.splitlines() if "::" in line]


def test_every_slow_test_runs_in_exactly_one_shard(tmp_path: Path) -> None:
    seen: list[str] = []
    for k in range(1, 5):
        run = _collect(tmp_path, "-m", "slow", "--slow-shard", f"{k}/4")
        assert run.returncode in (0, 5), run.stdout + run.stderr
        assert f"slow shard {k}/4:" in run.stdout
        seen += _ids(run.stdout)
    assert sorted(seen) == sorted(
        [f"test_slow[{n}]" for n in range(12)] + ["test_seeded[one-seed2026339]"]
    )
    assert len(seen) == len(set(seen))


def test_tests_not_marked_slow_are_left_to_m(tmp_path: Path) -> None:
    run = _collect(tmp_path, "--slow-shard", "2/4")
    ids = _ids(run.stdout)
    assert "test_fast" in ids
    kept = int(re.search(r"slow shard 2/4: (\d+)", run.stdout)[1])  # type: ignore[index]
    assert len(ids) == 1 + kept < 14


def test_the_seed_of_the_day_does_not_move_a_test(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from scripts.slow_shard import shard_of
    finally:
        sys.path.remove(str(ROOT))
    a = shard_of("tests/x.py::test[a-seed2026339]", 10)
    assert a == shard_of("tests/x.py::test[a-seed2026340]", 10)


@pytest.mark.parametrize("bad", ["3", "0/4", "5/4", "a/b"])
def test_a_bad_shard_is_refused_naming_it(tmp_path: Path, bad: str) -> None:
    run = _collect(tmp_path, "--slow-shard", bad)
    assert run.returncode == 4
    assert repr(bad) in run.stderr
