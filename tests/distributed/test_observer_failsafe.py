"""The observer is fail-safe: its own parts failing never blame a rank, nor stall the job.

* ``scout.enable`` from a short-lived thread: the observers live on.
* Rank 0's observer killed in a healthy run: restarted and logged, nothing attributed.
* Rank 2's observer killed, then rank 1 really stalls: rank 1 is named.
* A dead peer (its trainer SIGKILLed): exactly one record, through the callback, with
  the step it died at, and ``on_hang = "terminate"`` ends every other trainer; for
  rank 0 too, whose store host dies with it.
* After a hang verdict the launcher kills every rank at once: no record after the kill.
* Two jobs on adjacent ``MASTER_PORT`` s, the second's own store on the first's old
  observer port (``MASTER_PORT + 1``): both run clean, each with its own report.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from failsafe_scenarios import (
    busy_ports,
    dead_peer,
    enable_from_thread,
    free_port_run,
    killed_observer,
    sigstop_then_teardown,
)
from observer_scenarios import first_verdict, kill_quietly, wait_for

from scout_core.records.evidence import load_report
from scout_core.testing.harness import (
    RankFailedError,
    RankProcess,
    port_clash,
    retry_on_port_clash,
    run_ranks,
)

pytestmark = pytest.mark.distributed

HANG_S = 2.0
WORLD = 3
"""Ranks of the observer jobs below: a hang is named against a strict majority of the
ranks' progress (two against one); no layout is involved."""


def _brief(v: Any) -> tuple[Any, ...]:
    return (v.failure.value, v.status.value, list(v.outliers), v.step, v.time, v.detail)


def _verdicts(report: Path) -> list[Any]:
    return list(load_report(report).verdicts()) if report.exists() else []


@pytest.mark.timeout(200)
def test_enable_from_a_short_lived_thread_keeps_the_observers(tmp_path: Path) -> None:
    results = run_ranks(enable_from_thread, 3, args=(str(tmp_path), 5), timeout_s=150)
    for r in results:
        assert r["observer_alive"] and r["same_pid"] and r["restarts"] == 0, r
    assert results[0]["host_alive"] is True  # the store host, started by rank 0
    assert _verdicts(tmp_path) == []


@pytest.mark.timeout(200)
def test_killing_rank_0_observer_in_a_healthy_run_attributes_nothing(tmp_path: Path) -> None:
    results = run_ranks(killed_observer, WORLD, args=(str(tmp_path), 0, -1, 12), timeout_s=150)
    assert _verdicts(tmp_path) == []
    assert all(r["verdicts"] == [] for r in results)
    assert results[0]["restarts"] == 1
    assert any("restarting it" in line for line in results[0]["log"]), results[0]["log"]


@pytest.mark.timeout(240)
def test_dead_observer_then_a_real_stall_names_the_stalled_rank(tmp_path: Path) -> None:
    results = run_ranks(killed_observer, WORLD, args=(str(tmp_path), 2, 1, 60), timeout_s=200)
    verdicts = _verdicts(tmp_path)
    assert len(verdicts) == 1, [_brief(v) for v in verdicts]
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == ("hang", "attributed", [1])
    assert results[2]["restarts"] == 1
    for r in results:
        assert [(f, o) for f, o, _ in r["verdicts"]] == [("hang", [1])], r


# Rank 0 (it hosts the store) in CI; another rank under ``-m slow``.
@pytest.mark.parametrize("victim", [pytest.param(2, marks=pytest.mark.slow), 0])
@pytest.mark.timeout(240)
def test_a_dead_peer_gives_one_record_through_the_callback(victim: int, tmp_path: Path) -> None:
    report = tmp_path / "report"
    procs: list[RankProcess] = []
    at_step = 4

    def take_down(ranks: list[RankProcess]) -> None:
        pids = wait_for(ranks[0].result_path.parent / "dying", 150)
        os.kill(ranks[victim].proc.pid, signal.SIGSTOP)  # a dark machine: nothing answers
        for helper in (pids["observer"], pids["host"]):  # the store host lives on rank 0
            if helper is not None:
                kill_quietly(helper)

    def on_start(ranks: list[RankProcess]) -> None:
        procs.extend(ranks)
        threading.Thread(target=take_down, args=(ranks,), daemon=True).start()

    with pytest.raises(RankFailedError):
        run_ranks(
            dead_peer, WORLD, args=(str(report), victim, at_step), timeout_s=200, on_start=on_start
        )
    codes = [p.proc.returncode for p in procs]
    expected = [-signal.SIGKILL if r == victim else 86 for r in range(WORLD)]
    # A survivor that did not exit with the hang code says why in its own log.
    why = {
        p.rank: p.tail()
        for p, want in zip(procs, expected, strict=True)
        if p.proc.returncode != want
    }
    assert codes == expected, (codes, why)
    verdicts = _verdicts(report)
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]  # one record, not one per 30 s
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == ("hang", "attributed", [victim])
    assert v.surface == "observer"
    assert v.step == at_step  # the step the job stopped at, not 0
    scratch = procs[0].result_path.parent
    for r in range(WORLD):
        if r != victim:  # every surviving trainer's callback saw it before terminating
            seen = wait_for(scratch / f"callback-{r}-1", 5)
            assert (seen["failure"], seen["outliers"], seen["step"]) == ("hang", [victim], at_step)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_teardown_after_a_verdict_attributes_nothing_new(tmp_path: Path) -> None:
    report = tmp_path / "report"
    seen: dict[str, Any] = {}

    def teardown(ranks: list[RankProcess]) -> None:
        scratch = ranks[0].result_path.parent
        try:
            wait_for(scratch / "freeze-ready", 150)
            os.kill(ranks[2].proc.pid, signal.SIGSTOP)
            seen["first"] = first_verdict(str(report), HANG_S + 20)
            time.sleep(0.5)
            seen["kill"] = time.time()
            for r in ranks:  # the launcher kills every rank at once
                kill_quietly(r.proc.pid, signal.SIGKILL)
        finally:
            kill_quietly(ranks[2].proc.pid, signal.SIGCONT)

    def on_start(ranks: list[RankProcess]) -> None:
        threading.Thread(target=teardown, args=(ranks,), daemon=True).start()

    with pytest.raises(RankFailedError):
        run_ranks(
            sigstop_then_teardown, WORLD, args=(str(report), 2), timeout_s=200, on_start=on_start
        )
    assert seen.get("first") is not None
    time.sleep(HANG_S + 3)  # anything a survivor would write, it has written by now
    verdicts = _verdicts(report)
    assert [(v.failure.value, list(v.outliers)) for v in verdicts] == [("hang", [2])]
    assert all(v.time < seen["kill"] for v in verdicts)


@pytest.mark.timeout(300)
def test_jobs_on_adjacent_master_ports_run_clean_with_separate_reports(tmp_path: Path) -> None:
    def both() -> tuple[int, dict[str, Any]]:
        port = free_port_run(3)
        results: dict[str, Any] = {}

        def job(name: str, master: int, hold: int | None) -> None:
            try:
                results[name] = run_ranks(
                    busy_ports,
                    3,
                    args=(str(tmp_path / name), 5, hold),
                    timeout_s=240,
                    env={"MASTER_PORT": str(master)},
                )
            except Exception as exc:  # reported below
                results[name] = exc

        # job B's own store listens on B's MASTER_PORT = A's MASTER_PORT + 1: A's old
        # observer port, where A's observers used to write into B's store
        threads = [
            threading.Thread(target=job, args=("a", port, None)),
            threading.Thread(target=job, args=("b", port + 1, port + 1)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        clash = [r for r in results.values() if isinstance(r, Exception) and port_clash(str(r))]
        if clash:  # another process took one of the ports after the pick: pick again
            raise clash[0]
        return port, results

    port, results = retry_on_port_clash(both)
    for name in ("a", "b"):
        res = results[name]
        assert isinstance(res, list), res
        assert all(r["verdicts"] == [] for r in res)
        assert len({r["store_port"] for r in res}) == 1  # one store per job
        assert res[0]["store_port"] not in (port, port + 1, port + 2)
        assert _verdicts(tmp_path / name) == []
    assert results["a"][0]["store_port"] != results["b"][0]["store_port"]
