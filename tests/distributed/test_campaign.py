"""``scout campaign`` end to end: a short campaign in CI, the ``--quick`` run as ``slow``.

The short campaign draws three DDP trials from a seed (a low-mantissa compute SDC, an
input stall seen by the hang observer, and a clean control), runs them as real 4-rank
Gloo jobs, and checks the scores it computed from the evidence on disk: each victim
found, by name, with the right failure class, and no finding in the clean control.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout_core.cli.main import main

pytestmark = pytest.mark.distributed

SHORT = ["--setup", "ddp", "--kind", "compute_sdc", "--kind", "input_stall", "--kind", "clean"]


@pytest.mark.timeout(400)
def test_short_campaign_finds_each_victim_and_no_false_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scores.json"
    args = ["campaign", "--seed", "4", "--trials", "3", *SHORT, "--no-progress"]
    code = main([*args, "--out-dir", str(tmp_path / "evidence"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    trials = {t["kind"]: t for t in result["trials"]}
    assert set(trials) == {"compute_sdc", "input_stall", "clean"}, printed
    for kind in ("compute_sdc", "input_stall"):
        t = trials[kind]
        assert t["outcome"] == "detected", t
        assert t["exact_rank"] is True, t
        assert t["ttv_steps"] is not None and 0 <= t["ttv_steps"] <= 2, t
        assert t["ttv_s"] is not None and t["ttv_s"] < 30.0, t
    assert trials["clean"]["outcome"] == "clean", trials["clean"]
    total = result["scores"]["total"]
    assert total["recall"] == 1.0 and total["precision"] == 1.0 and total["exact_rank"] == 1.0
    assert total["clean_findings"] == 0 and total["fp_per_1k_clean_steps"] == 0.0
    assert total["clean_steps"] == trials["clean"]["clean_steps"] + sum(
        trials[k]["step"] for k in ("compute_sdc", "input_stall")
    )
    # the evidence stays for `scout report`, one directory per trial
    assert len(list((tmp_path / "evidence").glob("trial-*"))) == 3
    assert "-- by fault kind" in printed and "-- total" in printed


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_quick_campaign_finishes_in_ten_minutes_and_prints_scores(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "scout_core", "campaign", "--quick", "--seed", "1"]
    start = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--out-dir", str(tmp_path / "evidence"), "--json", str(tmp_path / "q.json")],
        capture_output=True,
        text=True,
        timeout=660,
        check=False,
    )
    elapsed = time.monotonic() - start
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert elapsed < 600, f"--quick took {elapsed:.0f} s"
    assert "-- total" in proc.stdout
    scores = json.loads((tmp_path / "q.json").read_text())["scores"]["total"]
    assert scores["trials"] == 11 and scores["recall"] is not None
