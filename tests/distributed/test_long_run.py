"""benchmarks/long_run.py, shortened: a healthy run with replay at every step stays flat.

The documented run is 5,000 steps (docs/development.md, *Benchmarks*); this runs the
same script as a user would, for 600 steps on 2 ranks, and checks what a long run must
show: no verdict and no incident, every history SCOUT keeps at or under its bound, no
Python objects gained and no resident memory growth after warm-up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scout_core.checkpoint.session_gate import _HISTORY as GATE_HISTORY
from scout_core.replay.driver import HISTORY as REPLAY_HISTORY

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY, WARMUP = 600, 50, 300

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_a_healthy_run_with_replay_every_step_stays_flat() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "long_run.py"),
            *("--ranks", "2", "--steps", str(STEPS), "--every", str(EVERY)),
            *("--warmup", str(WARMUP)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout)
    assert result["steps"] == STEPS and result["replay_interval"] == 1
    for rank, samples in result["samples"].items():
        assert [s["step"] for s in samples] == list(range(EVERY, STEPS + 1, EVERY)), rank
        last = samples[-1]
        assert last["session.verdicts"] == 0 and last["session.incidents"] == 0, (rank, last)
        # Every step runs a round, so by step 600 the histories have reached their bound.
        assert max(s["replay.history"] for s in samples) == REPLAY_HISTORY, rank
        assert max(s["gate.history"] for s in samples) <= GATE_HISTORY, rank
        # Objects: the least count late in the run is no higher than early after
        # warm-up (a few dozen of allocator and logging noise), where a leak of one
        # object per step would add 150.
        early = min(s["gc.objects"] for s in samples if WARMUP <= s["step"] <= 400)
        late = min(s["gc.objects"] for s in samples if s["step"] >= 450)
        assert late - early <= 50, (rank, early, late)
        growth_kb = samples[-1]["rss_kb"] - min(s["rss_kb"] for s in samples if s["step"] == WARMUP)
        assert growth_kb < 4096, (rank, growth_kb)
