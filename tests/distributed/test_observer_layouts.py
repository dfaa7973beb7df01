"""The observer under DP x TP 3x2 (plain PyTorch): equivalent ranks only, groups by role.

Replica peers (0, 2, 4) and (1, 3, 5) are compared; TP partners are not, since they
hold different shards, but whom a silent rank waits for is checked across groups:

* SIGSTOP of rank 2 before its forward: ``hang`` naming rank 2 only; its TP partner 3,
  stuck in the TP all-reduce, is recorded as waiting for it, never named;
* rank 2 runs a broadcast where its TP partner all-reduces: ``protocol_mismatch``
  naming rank 2 (its peers ran an all-reduce at that op id);
* both ranks of TP group (2, 3) sit inside their all-reduce, which never completes:
  ``group_stall`` naming that TP group, no rank;
* 40 clean steps: nothing, and no diagnosis round;
* PP 2 x DP 3, SIGSTOP of rank 2 (stage 0): ``hang`` naming rank 2 only, compared
  with its own stage; rank 3 of the other stage, waiting for it in ``recv``, is
  recorded as waiting, never named.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from observer_scenarios import first_verdict, kill_quietly, wait_for, wall_of

from scout_core.records.evidence import load_report
from scout_core.testing.harness import RankProcess, run_ranks

pytestmark = pytest.mark.distributed

WORLD = 6
HANG_S = 2.0
ENV = {"OMP_NUM_THREADS": "1"}


def _run(fault: str, report: Path, steps: int, culprit: int, **kw: Any) -> list[Any]:
    from observer_layout_scenarios import dptp_body

    return run_ranks(
        dptp_body, WORLD, args=(fault, str(report), steps, culprit), timeout_s=200, env=ENV, **kw
    )


def _records(report: Path) -> list[Any]:
    return list(load_report(report).verdicts()) if report.exists() else []


def _summary(verdicts: list[Any]) -> list[Any]:
    keep = ("reason", "stalled", "position", "stages", "waiting")
    return [
        (
            v.time % 1000,
            v.step,
            v.failure.value,
            v.status.value,
            list(v.group),
            list(v.outliers),
            *(v.detail.get(k) for k in keep),
        )
        for v in verdicts
    ]


@pytest.mark.timeout(260)
def test_sigstop_under_dp_tp_names_the_frozen_rank_not_its_tp_partner(tmp_path: Path) -> None:
    report = tmp_path / "report"
    times: dict[str, float | None] = {}

    def freezer(ranks: list[RankProcess]) -> None:
        scratch = ranks[0].result_path.parent
        pid = ranks[2].proc.pid
        try:
            wait_for(scratch / "freeze-ready", 150)
            times["freeze"] = wall_of(time.monotonic())
            os.kill(pid, signal.SIGSTOP)
            times["record"] = first_verdict(str(report), HANG_S + 15)
        finally:
            kill_quietly(pid, signal.SIGCONT)

    def on_start(ranks: list[RankProcess]) -> None:
        threading.Thread(target=freezer, args=(ranks,), daemon=True).start()

    results = _run("sigstop", report, 6, 2, on_start=on_start)
    verdicts = _records(report)
    assert len(verdicts) == 1, _summary(verdicts)
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == ("hang", "attributed", [2])
    assert list(v.group) == [0, 2, 4]  # compared with its replica peers only
    assert v.detail["waiting"]["3"]["for"] == [2]  # the TP partner waits, is not named
    assert v.detail["waiting"]["3"]["pending"]["collective"] == "all_reduce"
    assert v.detail["waiting"]["3"]["pending"]["group"] == "t"
    latency = v.time - times["freeze"]  # type: ignore[operator]  # the record's own time
    print(f"dp x tp sigstop: freeze -> record {latency:.2f} s")
    assert latency <= HANG_S + 3.0  # the freeze lands up to 1 s before the stall starts
    for res in results:  # every trainer got the one verdict through its callback
        assert [(r["failure"], r["outliers"]) for r in res["verdicts"]] == [("hang", [2])]
        assert "error" not in res


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_different_collective_in_a_tp_group_is_a_protocol_mismatch(tmp_path: Path) -> None:
    report = tmp_path / "report"
    results = _run("wrong_collective", report, 6, 2)
    verdicts = _records(report)
    assert len(verdicts) == 1, _summary(verdicts)
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == (
        "protocol_mismatch",
        "attributed",
        [2],
    )
    assert v.surface == "collective"
    assert list(v.group) == [0, 2, 4]
    assert v.detail["pending"]["2"]["collective"] == "broadcast"
    assert v.detail["expected"]["2"]["collective"] == "all_reduce"
    assert v.detail["waiting"]["3"]["for"] == [2]
    assert all("error" in r for r in results)  # the training groups timed out afterwards


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_a_stalled_tp_group_is_a_group_stall_naming_that_group(tmp_path: Path) -> None:
    report = tmp_path / "report"
    results = _run("tp_stall", report, 6, 2)
    verdicts = _records(report)
    assert len(verdicts) == 1, _summary(verdicts)
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == ("group_stall", "agree", [])
    assert list(v.group) == [2, 3]
    assert v.detail["stalled"] == [[2, 3]]
    assert v.detail["pending"]["collective"] == "all_reduce"
    assert v.scope.value == "group"
    for res in results:
        assert [r["failure"] for r in res["verdicts"]] == ["group_stall"]
        assert "error" not in res


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_forty_clean_steps_under_dp_tp_record_nothing(tmp_path: Path) -> None:
    report = tmp_path / "report"
    results = _run("clean", report, 40, -1)
    assert _records(report) == []
    for res in results:
        assert res["verdicts"] == []
        assert res["stats"]["rounds"] == 0 and res["stats"]["collectives"] == 0


@pytest.mark.timeout(260)
def test_sigstop_in_a_pipeline_stage_names_it_not_the_other_stage(tmp_path: Path) -> None:
    """PP 2 x DP 3 (plain PyTorch, send/recv between stages): rank 2 (stage 0) is stopped.
    Its stage peers 0 and 4 wait for it in their gradient all-reduce: it is named. Its
    replica's stage-1 rank 3 waits for it in ``recv``; 3 is behind its own stage peers
    1 and 5 (which wait for 3 in theirs), and is recorded as waiting, never named."""
    from observer_layout_scenarios import pp_body

    report = tmp_path / "report"
    times: dict[str, float | None] = {}
    culprit = 2

    def freezer(ranks: list[RankProcess]) -> None:
        scratch = ranks[0].result_path.parent
        pid = ranks[culprit].proc.pid
        try:
            wait_for(scratch / "freeze-ready", 150)
            times["freeze"] = wall_of(time.monotonic())
            os.kill(pid, signal.SIGSTOP)
            times["record"] = first_verdict(str(report), HANG_S + 15)
        finally:
            kill_quietly(pid, signal.SIGCONT)

    def on_start(ranks: list[RankProcess]) -> None:
        threading.Thread(target=freezer, args=(ranks,), daemon=True).start()

    results = run_ranks(
        pp_body, WORLD, args=(str(report), 6, culprit), timeout_s=200, env=ENV, on_start=on_start
    )
    verdicts = _records(report)
    assert len(verdicts) == 1, _summary(verdicts)
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == ("hang", "attributed", [2])
    assert list(v.group) == [0, 2, 4]  # stage 0 only: stage skew is never compared
    assert v.detail["stages"]["2"] == "idle"
    assert v.detail["waiting"]["3"]["for"] == [2]  # the other stage's partner waits
    # a point-to-point wait (send and recv share one code: the record names it "send")
    assert v.detail["waiting"]["3"]["pending"]["group"] == "p2p"
    latency = v.time - times["freeze"]  # type: ignore[operator]  # the record's own time
    print(f"pp x dp sigstop: freeze -> record {latency:.2f} s")
    assert latency <= HANG_S + 3.0  # the freeze lands up to 1 s before the stall starts
    for res in results:
        assert res["peers"] == ([0, 2, 4] if res["rank"] % 2 == 0 else [1, 3, 5])
        assert [(r["failure"], r["outliers"]) for r in res["verdicts"]] == [("hang", [2])]
