"""scripts/ci_watchdog.py stops a run at its budget, says what was slow and kills what it started.

Each case runs a small pytest session of its own in a subprocess, loading the plugin
as scripts/test.sh does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SUITE = """
import os, signal, subprocess, time
from pathlib import Path

def test_quick():
    pass

def test_slow_but_finishes():
    time.sleep(1.5)

def test_fails():
    assert False

def test_hangs_with_a_child_in_its_own_session():
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path(os.environ["CHILD_PIDFILE"]).write_text(str(child.pid))
    if os.environ.get("IGNORE_INTERRUPT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(300)
"""


def _run(
    tmp_path: Path, *options: str, suite: str = _SUITE, ignore_interrupt: bool = False
) -> tuple[int, str, float]:
    (tmp_path / "test_suite.py").write_text(suite, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["CHILD_PIDFILE"] = str(tmp_path / "child.pid")
    if ignore_interrupt:
        env["IGNORE_INTERRUPT"] = "1"
    args = [
        *("-m", "pytest", "-p", "scripts.ci_watchdog", "-p", "no:cacheprovider"),
        *("-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)),
        *("--junitxml", str(tmp_path / "junit.xml"), "--durations=5", *options),
        str(tmp_path / "test_suite.py"),
    ]
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,  # scripts.ci_watchdog imports from here, as in scripts/test.sh
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return res.returncode, res.stdout + res.stderr, time.monotonic() - start


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def test_the_budget_stops_the_run_prints_durations_and_kills_children(tmp_path: Path) -> None:
    code, out, took = _run(tmp_path, "--ci-budget-s", "4")
    assert code == 124, out
    assert took < 4 + 20, out
    assert "the run's budget of 4 s is spent" in out
    assert "running now: " in out and "test_hangs_with_a_child_in_its_own_session" in out
    assert "1 failed, 2 passed" in out
    slowest = out[out.index("slowest finished tests") :]
    assert slowest.index("test_slow_but_finishes") < slowest.index("test_quick"), out
    assert "stopped by the CI watchdog" in out  # pytest's own summary, after the interrupt
    assert "slowest 5 durations" in out
    assert (tmp_path / "junit.xml").read_text().count("<testcase") >= 3
    assert _gone(int((tmp_path / "child.pid").read_text())), "the test's child survived"


def test_a_run_that_ignores_the_interrupt_is_ended_after_the_grace(tmp_path: Path) -> None:
    code, out, took = _run(
        tmp_path, "--ci-budget-s", "4", "--ci-grace-s", "2", ignore_interrupt=True
    )
    assert code == 124, out
    assert took < 4 + 2 + 20, out
    assert "did not stop within 2 s of the interrupt" in out
    assert _gone(int((tmp_path / "child.pid").read_text())), "the test's child survived"


def test_without_a_budget_the_plugin_does_nothing(tmp_path: Path) -> None:
    code, out, _ = _run(tmp_path, suite="def test_one():\n    pass\n")
    assert code == 0, out
    assert "watchdog" not in out
