"""Two launches never share a report (issue 16, finding 7).

The finding: two jobs in one directory appended to the same ``scout-report/rank-0.jsonl``
under run id ``scout``; under plain torchrun ``TORCHELASTIC_RUN_ID`` is ``none``. Here two
launches with the default config, under plain torchrun's ``none``, write into the same
``report_dir``: each gets its own run id, the same on all its ranks, and its own
directory, and ``scout report`` shows both runs. Ranks configured with different run
ids fail ``enable`` on every rank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from storage_scenarios import launch

from scout_core.cli.main import main
from scout_core.records.evidence import load_report
from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "none"}  # what plain torchrun sets


@pytest.mark.timeout(300)
def test_two_default_launches_in_one_directory_stay_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report"
    ids = []
    for _ in range(2):
        results = run_ranks(launch, 2, args=(str(report), None, None), timeout_s=120, env=ENV)
        found = {r["run_id"] for r in results}
        assert len(found) == 1, found  # every rank of a launch agrees
        (run_id,) = found
        assert re.fullmatch(r"scout-\d{8}-\d{6}-[0-9a-f]{12}", run_id), run_id
        ids.append(run_id)
    assert ids[0] != ids[1]
    assert sorted(p.name for p in report.iterdir()) == sorted(ids)
    for run_id in ids:
        assert (report / run_id / "rank-0.jsonl").is_file()
        assert load_report(report / run_id).runs() == (run_id,)
    assert set(load_report(report).runs()) == set(ids)
    assert main(["report", str(report), "--json", "--all"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(r["run_id"] for r in data["runs"]) == sorted(ids)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ranks_with_different_run_ids_fail_enable_on_every_rank(tmp_path: Path) -> None:
    results = run_ranks(
        launch, 3, args=(str(tmp_path / "r"), "job-a", "job-b"), timeout_s=150, env=ENV
    )
    for r in results:
        assert r["error"] == "ConfigError", r
        assert "key 'run_id' differs across ranks" in r["message"]
