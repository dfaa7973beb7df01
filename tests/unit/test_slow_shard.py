"""scripts/slow_shard.py: shards 1/N .. N/N run every slow test once; nothing else moves.

Each case runs a small pytest session of its own in a subprocess, loading the plugin
as scripts/test.sh does.
"""

from __future__ import annotations

import json
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


def _plugin():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT))
    try:
        from scripts import slow_shard
    finally:
        sys.path.remove(str(ROOT))
    return slow_shard


def test_the_seed_of_the_day_does_not_move_a_test() -> None:
    plugin = _plugin()
    names = [f"tests/x.py::test[{c}]" for c in "abcdefgh"]
    today = plugin.deal([*names, "tests/x.py::test[z-seed2026339]"], 3, {})
    tomorrow = plugin.deal([*names, plugin.key("tests/x.py::test[z-seed2026340]")], 3, {})
    assert plugin.key("tests/x.py::test[z-seed2026339]") == "tests/x.py::test[z]"
    assert today.pop("tests/x.py::test[z-seed2026339]") == tomorrow.pop("tests/x.py::test[z]")
    assert today == tomorrow


def test_an_edit_above_a_docs_block_does_not_move_it() -> None:
    # A docs block's id carries its line number; its recorded name must not.
    plugin = _plugin()
    before = "tests/docs/test_docs.py::test_shell_block[docs/development.md:213]"
    after = "tests/docs/test_docs.py::test_shell_block[docs/development.md:219]"
    assert plugin.key(before) == plugin.key(after)
    assert plugin.key(after) == "tests/docs/test_docs.py::test_shell_block[docs/development.md]"
    other = "tests/docs/test_docs.py::test_shell_block[docs/deepspeed.md:213]"
    assert plugin.key(other) != plugin.key(before)
    assert plugin.key("tests/x.py::test[a.md-3]") == "tests/x.py::test[a.md-3]"


def test_long_tests_are_dealt_to_different_shards(tmp_path: Path) -> None:
    # Three 100 s tests and ten 1 s ones over three shards: one long test each, and no
    # shard's recorded total more than one short test above another's.
    ids = [f"test_slow[{n}]" for n in range(12)] + ["test_seeded[one-seed2026339]"]
    long = {"test_slow[3]", "test_slow[7]", "test_slow[8]"}
    durations = {
        f"test_suite.py::{name}".replace("-seed2026339", ""): (100.0 if name in long else 1.0)
        for name in ids
    }
    file = tmp_path / "durations.json"
    file.write_text(json.dumps(durations))
    totals = []
    for k in (1, 2, 3):
        run = _collect(
            tmp_path, "-m", "slow", "--slow-shard", f"{k}/3", "--slow-durations", str(file)
        )
        assert run.returncode == 0, run.stdout + run.stderr
        kept = _ids(run.stdout)
        assert len(long & set(kept)) == 1, (k, kept)
        totals.append(sum(100.0 if name in long else 1.0 for name in kept))
        assert re.search(
            rf"slow shard {k}/3: {len(kept)} slow test\(s\) kept, \d+ s recorded \(0 without",
            run.stdout,
        )
    assert max(totals) - min(totals) <= 1.0, totals


def test_a_test_without_a_recorded_time_counts_as_the_median() -> None:
    plugin = _plugin()
    shard = plugin.deal(["a", "b", "c", "new"], 2, {"a": 10.0, "b": 1.0, "c": 1.0})
    # median 1.0: a alone in shard 1; b, c and the new test in shard 2.
    assert shard == {"a": 1, "b": 2, "c": 2, "new": 2}


def test_record_merges_the_times_of_passed_slow_tests_only(tmp_path: Path) -> None:
    (tmp_path / "test_rec.py").write_text(
        "import time, pytest\n"
        "def test_fast():\n    pass\n"
        "@pytest.mark.slow\ndef test_ok():\n    time.sleep(0.3)\n"
        "@pytest.mark.slow\ndef test_bad():\n    assert False\n"
        "@pytest.mark.slow\n@pytest.mark.parametrize('b', ['docs/p.md:3', 'docs/p.md:9'])\n"
        "def test_block(b):\n    time.sleep(0.3)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    record = tmp_path / "rec.json"
    record.write_text(json.dumps({"earlier::test": 5.0}))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "scripts.slow_shard",
            "-q",
            "--slow-record",
            str(record),
            str(tmp_path / "test_rec.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    data = json.loads(record.read_text())
    assert set(data) == {
        "earlier::test",
        next(k for k in data if k.endswith("test_rec.py::test_ok")),
        next(k for k in data if k.endswith("test_rec.py::test_block[docs/p.md]")),
    }
    ok = next(v for k, v in data.items() if k.endswith("::test_ok"))
    assert 0.3 <= ok < 5.0
    # The two blocks of one page share a name, and their times add up.
    blocks = next(v for k, v in data.items() if k.endswith("::test_block[docs/p.md]"))
    assert 0.6 <= blocks < 5.0


def test_a_bad_durations_file_is_refused_naming_it(tmp_path: Path) -> None:
    file = tmp_path / "durations.json"
    file.write_text(json.dumps({"t::x": "slow"}))
    run = _collect(tmp_path, "--slow-shard", "1/2", "--slow-durations", str(file))
    assert run.returncode == 4
    assert str(file) in run.stderr and "'t::x'" in run.stderr


def test_the_recorded_times_name_tests_that_exist() -> None:
    # A renamed or deleted test leaves a stale entry: it would weigh on no shard, but the
    # file would stop saying what the shards hold. Every test is collected, not only the
    # slow ones: test_waitfor_layouts draws by the day which of its cases run in CI, so
    # a recorded case is slow on most days and not on the day it is drawn.
    plugin = _plugin()
    recorded = plugin.load_durations(plugin.DEFAULT_DURATIONS)
    assert len(recorded) >= 5
    # Collect only the files the keys name (the whole suite takes half a minute to collect).
    files = sorted(
        {name.split("::")[0] for name in recorded if (ROOT / name.split("::")[0]).is_file()}
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "-m",
            "not gpu",
            "-p",
            "no:cacheprovider",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    collected = {plugin.key(line) for line in run.stdout.splitlines() if "::" in line}
    stale = sorted(set(recorded) - collected)
    assert stale == [], f"scripts/slow_durations.json names tests that do not exist: {stale}"


@pytest.mark.parametrize("bad", ["3", "0/4", "5/4", "a/b"])
def test_a_bad_shard_is_refused_naming_it(tmp_path: Path, bad: str) -> None:
    run = _collect(tmp_path, "--slow-shard", bad)
    assert run.returncode == 4
    assert repr(bad) in run.stderr
