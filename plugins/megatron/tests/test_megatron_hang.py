"""A SIGSTOPped rank of a DP3 x TP2 Megatron job is named ``hang`` within hang_timeout_s + 2 s.

The culprit (rank 3) is stopped right before an iteration. Its TP partner (rank 2)
waits for it inside Megatron's tensor-parallel all-reduce (the first of the
iteration); the other ranks finish their forward and backward and wait inside the
data-parallel gradient all-reduce. The observers compare each rank with its replica
peers only (the same TP position): the culprit's group (1, 3, 5) sees it behind,
idle, and names it; the partner's group (0, 2, 4) sees the partner behind inside a
TP all-reduce whose other member is the named culprit, so the partner is recorded
as *waiting for it* in the culprit's record, never named. The test continues the
process afterwards, so the job finishes and every rank's session holds the verdict.
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
CULPRIT = 3


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


@pytest.mark.timeout(420)
def test_sigstop_is_a_hang_on_that_rank() -> None:
    from mg_scout_scenarios import frozen

    times: dict[str, Any] = {}

    def freezer(ranks: list[Any]) -> None:
        scratch = ranks[0].result_path.parent
        pid = ranks[CULPRIT].proc.pid
        try:
            _wait_for(scratch / "freeze-ready", 300)
            time.sleep(0.5)  # inside the culprit's idle moment, before its collectives
            times["freeze"] = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            times["record"] = _first_hang(scratch / "report", HANG_S + 15)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def on_start(ranks: list[Any]) -> None:
        threading.Thread(target=freezer, args=(ranks,), daemon=True).start()

    over = {"observer": True, "hang_timeout_s": HANG_S}
    results = run_ranks(
        frozen, 6, args=(CULPRIT, 4, 6, over), timeout_s=400, env=ENV, on_start=on_start
    )
    assert times.get("record") is not None, "no hang record"
    latency = times["record"] - times["freeze"]
    print(f"SIGSTOP -> hang record {latency:.2f} s (hang_timeout_s={HANG_S})")
    assert latency <= HANG_S + 2.0
    partner = CULPRIT - 1  # global rank = t + 2d: the TP partner of rank 3 is rank 2
    replicas = [CULPRIT % 2, CULPRIT % 2 + 2, CULPRIT % 2 + 4]  # its peer group: [1, 3, 5]
    for r in results:
        assert r["steps"] == 6
        # one record for the job, handed to every rank: the culprit's group names it
        assert r["verdicts"] == [[4, "progress", "hang", "attributed", [CULPRIT], "rank", replicas]]
        (record,) = r["records"]
        detail = record["detail"]
        assert detail["stages"] == {str(x): "collective" for x in replicas} | {
            str(CULPRIT): "idle"  # stopped: not inside any collective
        }
        assert {detail["pending"][str(x)]["group"] for x in replicas if x != CULPRIT} == {"d"}
        assert detail["position"] == {str(CULPRIT): "behind"}
        assert detail["coordinates"][str(CULPRIT)] < detail["majority"]
        # the TP partner, behind in its own peer group, waits for the culprit: not named
        assert detail["waiting"] == {
            str(partner): {"for": [CULPRIT], "pending": detail["waiting"][str(partner)]["pending"]}
        }
        assert detail["waiting"][str(partner)]["pending"]["group"] == "t"
        named = {x for v in r["records"] for x in v["outliers"]}
        assert named == {CULPRIT} and partner not in named
