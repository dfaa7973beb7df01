"""The observer names the frozen rank: SIGSTOP of the whole trainer, and a thread
spinning with the GIL held. Both freezes happen right before a collective that the
peers are already waiting in; the verdict must come within hang_timeout_s + 2 s."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from observer_scenarios import (
    HANG_S,
    first_verdict,
    free_port,
    kill_quietly,
    scenario,
    wait_for,
)

from scout_core.records.evidence import load_report
from scout_core.testing.harness import RankProcess, run_ranks

WORLD = 4
CULPRIT = 2


def _only_verdict(report_dir: Path) -> Any:
    verdicts = load_report(report_dir).verdicts()
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    return verdicts[0]


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_sigstop_before_collective_is_a_hang_on_that_rank(tmp_path: Path) -> None:
    report = tmp_path / "report"
    times: dict[str, float | None] = {}

    def freezer(ranks: list[RankProcess]) -> None:
        scratch = ranks[0].result_path.parent
        pid = ranks[CULPRIT].proc.pid
        try:
            wait_for(scratch / "freeze-ready", 90)
            times["freeze"] = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            times["record"] = first_verdict(str(report), HANG_S + 10)
        finally:
            kill_quietly(pid, signal.SIGCONT)

    def on_start(ranks: list[RankProcess]) -> None:
        threading.Thread(target=freezer, args=(ranks,), daemon=True).start()

    results = run_ranks(
        scenario,
        WORLD,
        args=("sigstop", free_port(), str(report), CULPRIT),
        timeout_s=120,
        on_start=on_start,
    )
    verdict = _only_verdict(report)
    assert verdict.failure.value == "hang"
    assert verdict.status.value == "attributed"
    assert list(verdict.outliers) == [CULPRIT]
    assert list(verdict.group) == list(range(WORLD))
    assert verdict.scope.value == "rank"
    assert verdict.detail["position"] == {str(CULPRIT): "behind"}
    assert verdict.detail["stages"][str(CULPRIT)] == "idle"
    assert {verdict.detail["stages"][str(r)] for r in range(WORLD) if r != CULPRIT} == {
        "collective"
    }
    assert times["record"] is not None
    latency = times["record"] - times["freeze"]  # type: ignore[operator]
    print(f"sigstop: freeze -> record {latency:.2f} s (hang_timeout_s={HANG_S})")
    assert latency <= HANG_S + 2.0
    # every trainer, the frozen one once continued, got the verdict through its callback
    for r in results:
        assert [v["failure"] for v in r["verdicts"]] == ["hang"], r
        assert r["stats"]["rounds"] == 1
        assert r["stats"]["collectives"] == 1  # the one C3 AllGather


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_gil_held_by_a_spinning_thread_is_a_hang_with_stacks(tmp_path: Path) -> None:
    report = tmp_path / "report"
    times: dict[str, float | None] = {}

    def on_start(ranks: list[RankProcess]) -> None:
        def watch() -> None:
            times["freeze"] = wait_for(ranks[0].result_path.parent / "freeze-at", 90)
            times["record"] = first_verdict(str(report), HANG_S + 10)

        threading.Thread(target=watch, daemon=True).start()

    run_ranks(
        scenario,
        WORLD,
        args=("gil", free_port(), str(report), CULPRIT),
        kwargs={"on_hang": "dump_stacks"},
        timeout_s=120,
        on_start=on_start,
    )
    verdict = _only_verdict(report)
    assert (verdict.failure.value, list(verdict.outliers)) == ("hang", [CULPRIT])
    assert times["record"] is not None
    latency = times["record"] - times["freeze"]  # type: ignore[operator]
    print(f"gil: freeze -> record {latency:.2f} s (hang_timeout_s={HANG_S})")
    assert latency <= HANG_S + 2.0
    # faulthandler dumped the stuck rank's threads while the GIL was held, and only its
    stacks = report / f"stacks-rank-{CULPRIT}.txt"
    text = stacks.read_text()
    assert "_hold_gil" in text and "scenario" in text, text
    for r in range(WORLD):
        if r != CULPRIT:
            path = report / f"stacks-rank-{r}.txt"
            assert not path.exists() or path.read_text() == ""
