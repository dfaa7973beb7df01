"""Healthy training costs the observers nothing; observers never outlive their trainer;
the hang timeout must come before the training communicator's own timeout."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from observer_scenarios import (
    alive,
    broken_observer,
    free_port,
    healthy,
    kill_quietly,
    orphan,
    wait_for,
)

from scout_core.testing.harness import RankFailedError, RankProcess, retry_on_port_clash, run_ranks


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_healthy_run_exchanges_nothing_and_records_nothing(tmp_path: Path) -> None:
    report = tmp_path / "report"
    steps = 200
    results = retry_on_port_clash(
        lambda: run_ranks(healthy, 4, args=(free_port(), str(report), steps), timeout_s=120)
    )
    for r in results:
        assert r["step"] == steps
        assert r["elapsed"] > 2 * 2.0  # the run outlasted the hang timeout twice over
        # 2 layers + optimizer pre + step + 2 all-reduce enter/exit + fetch enter/exit per step
        assert r["op_id"] >= steps * 9
        assert r["verdicts"] == 0
        stats = r["stats"]
        assert stats["rounds"] == 0
        assert stats["collectives"] == 0
        # one round-signal wait posted once at start, held by the store: not per step
        assert stats["store_ops"] == 1
    assert not report.exists() or not list(report.glob("**/rank-*.jsonl"))


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_killing_a_trainer_leaves_no_orphaned_observer(tmp_path: Path) -> None:
    victim = 2
    seen: dict[str, Any] = {}

    def killer(ranks: list[RankProcess]) -> None:
        scratch = ranks[0].result_path.parent
        pids = {r.rank: wait_for(scratch / f"observer-{r.rank}", 90) for r in ranks}
        seen["observers"] = pids
        assert all(alive(p) for p in pids.values())
        os.kill(ranks[victim].proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(pids[victim]) and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["victim_observer_alive"] = alive(pids[victim])
        seen["others_alive"] = [alive(p) for r, p in pids.items() if r != victim]
        (scratch / "stop").write_text("")

    procs: list[RankProcess] = []

    def on_start(ranks: list[RankProcess]) -> None:
        procs.extend(ranks)
        threading.Thread(target=killer, args=(ranks,), daemon=True).start()

    with pytest.raises(RankFailedError):
        retry_on_port_clash(
            lambda: run_ranks(
                orphan, 4, args=(free_port(), str(tmp_path)), timeout_s=90, on_start=on_start
            )
        )
    assert [p.proc.returncode for p in procs] == [0, 0, -signal.SIGKILL, 0]
    assert seen["victim_observer_alive"] is False
    assert seen["others_alive"] == [True, True, True]
    deadline = time.monotonic() + 5  # the harness killed the rest: their observers follow
    while any(alive(p) for p in seen["observers"].values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in seen["observers"].values():
        kill_quietly(pid)  # never leave a process behind, even when the assert fails
    assert not [p for p in seen["observers"].values() if alive(p)]


def watchdog_body() -> list[str]:
    import torch.distributed as dist

    from scout_core.config import Config
    from scout_core.errors import ConfigError
    from scout_core.observer import check_watchdog

    short = dist.new_group(backend="gloo", timeout=timedelta(seconds=9))
    outcomes = []
    for hang, stage, join, group in [
        (10.0, None, 20.0, None),
        (60.0, None, 20.0, None),
        (2.0, None, 1.0, short),  # 2 + 1 + 5 s margin < 9 s
        (2.0, 4.0, 1.0, short),  # the stage timeout: 4 + 1 + 5 >= 9 s
        (2.0, None, 30.0, None),
        (2.0, None, 35.0, None),  # a round may wait the join timeout for a silent peer
    ]:
        cfg = Config(hang_timeout_s=hang, stage_timeout_s=stage, observer_join_timeout_s=join)
        try:
            check_watchdog(cfg, group)
            outcomes.append("ok")
        except ConfigError as exc:
            outcomes.append(str(exc).split(" ", 1)[0])
    return outcomes


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_watchdog_check_uses_the_communicator_timeout() -> None:
    # run_ranks gives the default group timeout_s = 40 s
    results = run_ranks(watchdog_body, 3, timeout_s=40)
    assert results[0] == ["ok", "hang_timeout_s", "ok", "stage_timeout_s", "ok", "hang_timeout_s"]
    assert all(r == results[0] for r in results)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_an_observer_that_cannot_start_fails_every_rank_alike(tmp_path: Path) -> None:
    results = run_ranks(broken_observer, 3, args=(str(tmp_path), 1), timeout_s=120)
    errors = [r["error"] for r in results]
    assert errors[0] == errors[1] == errors[2], errors  # identical on every rank
    assert errors[0].startswith("ScoutError: the hang observer cannot start: rank 1:"), errors
    assert "exited with 3 before joining" in errors[0]
    assert all(r["elapsed"] < 90 for r in results)  # nobody waits for a watchdog
