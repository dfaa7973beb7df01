"""A SIGSTOPped DeepSpeed rank is named ``hang`` within hang_timeout_s + 2 s, nobody else.

Real DeepSpeed engines on CPU (Gloo), the hang observer on (one process per rank):

* ZeRO-2, 4 data-parallel ranks: rank 2 is stopped right before an iteration; its
  peers wait for it in the gradient all-reduce. One record, naming rank 2, idle.
* PipelineEngine, 2 stages x 3 replicas (stage 0 = ranks 0-2, stage 1 = ranks 3-5):
  rank 4 (stage 1) is stopped. Each stage is compared only with itself, so stage skew
  is never a hang; stage 1 names rank 4; its stage-0 partner (rank 1), behind its own
  stage peers inside a point-to-point operation with rank 4, is recorded as waiting for
  it, never named.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
HANG_S = 4.0
SECTION: dict[str, Any] = {"observer": True, "hang_timeout_s": HANG_S, "recipes": ["hidden"]}


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.02)


def _first_hang(report: Path, timeout: float) -> float | None:
    """When a hang record first appears in any rank's evidence file (monotonic), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in report.glob("*/rank-*.jsonl"):
            with contextlib.suppress(OSError, json.JSONDecodeError):
                for line in path.read_text(encoding="utf-8").splitlines():
                    if json.loads(line).get("failure") == "hang":
                        return time.monotonic()
        time.sleep(0.05)
    return None


def _freezing(culprit: int, times: dict[str, Any]) -> Any:
    """``on_start`` for run_ranks: SIGSTOP the culprit at its freeze point, time the record,
    continue it."""

    def freezer(ranks: list[Any]) -> None:
        scratch = ranks[0].result_path.parent
        pid = ranks[culprit].proc.pid
        try:
            _wait_for(scratch / "freeze-ready", 200)
            time.sleep(0.5)  # inside the culprit's idle moment, before its collectives
            times["freeze"] = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            times["record"] = _first_hang(scratch / "report", HANG_S + 15)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def on_start(ranks: list[Any]) -> None:
        threading.Thread(target=freezer, args=(ranks,), daemon=True).start()

    return on_start


def _latency(times: dict[str, Any], label: str) -> float:
    assert times.get("record") is not None, "no hang record"
    latency: float = times["record"] - times["freeze"]
    print(f"{label}: SIGSTOP -> hang record {latency:.2f} s (hang_timeout_s={HANG_S})")
    return latency


@pytest.mark.timeout(260)
def test_sigstop_of_a_zero_rank_is_a_hang_naming_it() -> None:
    from ds_hang_scenarios import zero_hang

    culprit, times = 2, dict[str, Any]()
    results = run_ranks(
        zero_hang,
        4,
        args=(2, culprit, 2, 4, SECTION),
        timeout_s=200,
        env=ENV,
        on_start=_freezing(culprit, times),
    )
    assert _latency(times, "ZeRO-2") <= HANG_S + 2.0
    for r in results:
        assert r["steps"] == 4
        (v,) = r["verdicts"]  # one record for the job, handed to every rank
        assert (v["failure"], v["status"], v["scope"]) == ("hang", "attributed", "rank")
        assert (v["outliers"], v["group"], v["step"]) == ([culprit], [0, 1, 2, 3], 2)
        assert v["detail"]["stages"][str(culprit)] == "idle"
        assert v["detail"]["position"] == {str(culprit): "behind"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigstop_in_a_pipeline_stage_names_it_not_the_other_stage() -> None:
    from ds_hang_scenarios import pipeline_hang

    culprit, times = 4, dict[str, Any]()
    results = run_ranks(
        pipeline_hang,
        6,
        args=(culprit, 3, 5, SECTION),
        timeout_s=250,
        env=ENV,
        on_start=_freezing(culprit, times),
    )
    assert _latency(times, "pipeline 2x3") <= HANG_S + 2.0
    for r in results:
        assert r["steps"] == 5
        assert r["peers"] == ([0, 1, 2] if r["rank"] < 3 else [3, 4, 5])
        named = {x for v in r["verdicts"] for x in v["outliers"]}
        assert named == {culprit}, r["verdicts"]  # no stage-skew false positive
        (v,) = r["verdicts"]
        assert (v["failure"], v["status"], v["scope"]) == ("hang", "attributed", "rank")
        assert (v["outliers"], v["group"], v["step"]) == ([culprit], [3, 4, 5], 3)
        assert v["detail"]["stages"][str(culprit)] == "idle"
        # the culprit's stage-0 partner waits for it (point-to-point): not named
        assert v["detail"]["waiting"]["1"]["for"] == [culprit]
