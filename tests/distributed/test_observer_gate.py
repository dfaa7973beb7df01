"""A hang verdict drives the checkpoint gate's retrieval, end to end through ``scout.enable``.

DDP 3 on TinyLM, replay and the in-memory gate on, the observer on. Rank 1 really
stalls (a CPU-side sleep before its forward) at step ``STALL``; its peers wait in
DDP's gradient all-reduce. The observers write one ``hang`` naming rank 1, and every
trainer receives it through the session's verdict path (the callback). Once the
stall is over, every rank passes that verdict's failure to ``session.recover``:
the gate runs the full-catalog sweep (paper Algorithm 3: the recipes are clean
here, so it selects *latest*) and restores it, bitwise (model, optimizer, RNG and
caller state), on every rank.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from test_gate_dense import build, config, fingerprint, iteration

from scout_core.records.evidence import load_report
from scout_core.testing.harness import run_ranks
from scout_core.vocabulary import Failure

pytestmark = pytest.mark.distributed

HANG_S = 2.0
STALL = 8  # the catalog (K = 7) closed at steps 3 and 7: verified 3; latest is step 8
STALLER = 1


def hang_then_recover(tmp: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import scout_core as scout

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build("ddp", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    seen: list[Any] = []
    cfg = dataclasses.replace(
        config(tmp), observer=True, hang_timeout_s=HANG_S, observer_join_timeout_s=15.0
    )
    session = scout.enable(wrapped, opt, config=cfg, callback=seen.append)
    handle = session.gate
    assert handle is not None
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    handle.set_extra_state(lambda: extra)
    refs: dict[int, dict[str, str]] = {}
    for step in range(STALL + 1):
        if step == STALL and rank == STALLER:
            time.sleep(HANG_S + 4.0)  # a real stall: nothing is published
        iteration(wrapped, opt, extra, step, rank)
        refs[step] = fingerprint(root, opt, extra)
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:  # the verdict reaches every trainer
        time.sleep(0.05)
    assert seen, "no verdict reached this trainer"
    verdict = seen[0]
    got = session.recover(verdict.failure)
    out = {
        "verdict": [verdict.failure.value, list(verdict.outliers), verdict.step],
        "restored": [got.step, got.role, got.source],
        "bitwise": fingerprint(root, opt, extra) == refs[got.step],
        "resume": session.step,
    }
    session.close()
    return out


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_hang_verdict_then_recover_restores_the_gates_choice_bitwise(tmp_path: Path) -> None:
    results = run_ranks(
        hang_then_recover, 3, args=(str(tmp_path),), timeout_s=300, env={"OMP_NUM_THREADS": "1"}
    )
    for r in results:
        assert r["verdict"][:2] == ["hang", [STALLER]], r
        # a clean full-catalog sweep after a hang selects latest: the last step's capture
        assert r["restored"] == [STALL, "latest", "memory"], r
        assert r["bitwise"], r
        assert r["resume"] == STALL + 1, r
    verdicts = list(load_report(tmp_path / "report").verdicts())
    assert [(v.failure, list(v.outliers)) for v in verdicts] == [(Failure.HANG, [STALLER])]
