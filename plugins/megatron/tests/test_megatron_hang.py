"""A SIGSTOPped rank of a DP3 x TP2 Megatron job is named ``hang`` within hang_timeout_s + 2 s.

The culprit is stopped right before an iteration: its TP partner waits for it inside
Megatron's tensor-parallel all-reduce (the embedding's, the first of the iteration),
the other ranks inside the data-parallel gradient all-reduce. The hang observer (one
process per rank, its own store and Gloo group) sees the culprit's progress stay
behind and names it; the test continues the process afterwards, so the job finishes
and every rank's session holds the verdict.

The TP partner is behind the majority too (it never got past the all-reduce it shares
with the culprit), so the core observer's exact consensus on (step, op) names it as
well; its evidence says it is blocked in a collective while the culprit is idle
(``stages``). Naming only the idle rank needs a refinement of the observer's verdict
rule (see docs/megatron.md, "Hangs").
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
@pytest.mark.xfail(
    strict=True,
    reason="expects one job-wide hang record (group = all 6 ranks); observer rounds now run "
    "per peer group (issue 10 item 3), so the record's group is the culprit's replica group "
    "[1, 3, 5]. The hang is still named in 3.6 s; the assertions must be rewritten.",
)
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
    for r in results:
        assert r["steps"] == 6
        hangs = [v for v in r["verdicts"] if v[2] == "hang"]
        assert len(hangs) == 1, r["verdicts"]
        assert [v for v in r["verdicts"] if v[2] != "hang"] == []
        step, surface, _, status, outliers, scope, group = hangs[0]
        assert step == 4  # the iteration the culprit never started
        assert (surface, status, scope, group) == ("progress", "attributed", "rank", list(range(6)))
        assert CULPRIT in outliers and set(outliers) <= {CULPRIT, partner}, outliers
        (stages,) = r["stages"]
        assert stages[str(CULPRIT)] == "idle"  # stopped: not inside any collective
        assert {stages[str(x)] for x in range(6) if x != CULPRIT} == {"collective"}
        assert r["position"] == [{str(x): "behind" for x in outliers}]
