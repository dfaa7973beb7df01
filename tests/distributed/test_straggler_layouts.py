"""A compute straggler named where every peer group holds two replicas (issue 34).

Layouts: :data:`scout_core.campaign.pair_layouts.PAIR_LAYOUTS` (DDP x 2, HSDP 2 x 2,
DP 2 x TP 2, 2 pipeline stages x DP 2), each a real training job of ``scout
campaign``'s rank bodies, Gloo on CPU. A vote over two replicas names nobody; the
round's timing pool (equal work: shard and TP partners, the same block index of every
stage) or, for DDP x 2, each rank's own history must.

SCOUT runs with the default ``Config`` except the report directory, a hidden-layer
replay every step (``replay_interval = 1``, so a few steps see several rounds), and
:data:`scout_core.testing.BUSY_HOST`'s ``straggler_min_excess_s`` (0.3 s): the ranks
and their observers share two loaded cores here, where a rank descheduled for tens of
milliseconds inside a timed replay is common, and the default 0.05 s would read that
as a slow rank (docs/configuration.md, *On a busy host*).

Faults, the victim rank and the step drawn from the seed in the test id
(``SCOUT_TEST_SEED``, else the day's number):

* a compute straggler: the victim sleeps inside each of its blocks' forward (a forward
  hook, training and replay calls alike), 0.25 s per block call, for 4 steps: named
  exactly (``straggler``, rank scope) within ``straggler_rounds`` + 1 hidden rounds;
* a job-wide slowdown: every rank sleeps the same way for 10 steps: no rank named
  (DDP x 2 also writes the pair's group-scoped job-wide record);
* one slow step on one rank: no record;
* 40 clean steps: no record.

CI runs the straggler on every layout; the rest is marked ``slow``.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from scout_core.campaign.pair_layouts import BLOCKS, PAIR_LAYOUTS
from scout_core.campaign.plan import FIRST_STEP, Setup, Trial, missing_module
from scout_core.campaign.runner import run_trial
from scout_core.config import Config
from scout_core.records.reading import load_report
from scout_core.records.record import VERDICT_SCHEMA
from scout_core.testing import BUSY_HOST

pytestmark = pytest.mark.distributed

SEED = int(
    os.environ.get("SCOUT_TEST_SEED") or time.gmtime().tm_yday + 1000 * time.gmtime().tm_year
)
"""The seed of every draw here (module doc)."""

PER_BLOCK_S = 0.25
"""The straggler's sleep per block call: 3 input variants replay the sampled block, so
its ``t_M`` grows by 0.75 s, well past the busy host's 0.3 s."""
ROUNDS = Config().straggler_rounds


def _settings() -> dict[str, Any]:
    return {"replay_interval": 1, **BUSY_HOST}


def _setup(layout: str) -> Setup:
    setup = PAIR_LAYOUTS[layout]
    missing = missing_module(setup)
    if missing is not None:
        pytest.skip(f"{missing} is not installed")
    return setup


def _params(kind: str, ci: bool) -> list[Any]:
    return [
        pytest.param(layout, id=f"{layout}-{kind}-seed{SEED}", marks=() if ci else pytest.mark.slow)
        for layout in PAIR_LAYOUTS
    ]


def _run(
    layout: str, kind: str, victim: int | None, step: int, *, steps: int, window: int, tmp: Path
) -> list[Any]:
    setup = _setup(layout)
    trial = Trial(0, layout, kind, victim, step, steps, setup.world)
    fault = {"delay_s": PER_BLOCK_S * BLOCKS[layout], "window": window}
    score = run_trial(trial, setup, tmp, fault=fault, settings=_settings())
    assert score.error is None, score.error
    report_dir = tmp / f"trial-000-{layout}-{kind}"
    if not report_dir.is_dir():
        return []
    report = load_report(report_dir, strict=False)
    return [r for r in report.records if r.schema == VERDICT_SCHEMA and r.failure is not None]


def _summary(records: list[Any]) -> list[Any]:
    return [
        (r.step, r.failure.value, r.scope.value, list(r.group), list(r.outliers), r.detail)
        for r in records
    ]


def _draw(layout: str, kind: str) -> tuple[int, int]:
    draw = random.Random(f"{SEED}:{layout}:{kind}")
    return draw.randrange(PAIR_LAYOUTS[layout].world), draw.randrange(FIRST_STEP, FIRST_STEP + 2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", _params("straggler", ci=True))
def test_a_compute_straggler_is_named_exactly(layout: str, tmp_path: Path) -> None:
    victim, step = _draw(layout, "straggler")
    print(f"{layout}: victim rank {victim}, step {step}, seed {SEED}")
    window = ROUNDS + 2
    records = _run(
        layout,
        "compute_straggler",
        victim,
        step,
        steps=step + window + 1,
        window=window,
        tmp=tmp_path,
    )
    assert records, "no record"
    got = {(r.failure.value, tuple(r.outliers), r.scope.value) for r in records}
    assert got == {("straggler", (victim,), "rank")}, _summary(records)
    # the hidden layer replays every step: named within straggler_rounds + 1 of its rounds
    assert min(r.step for r in records) <= step + ROUNDS, _summary(records)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", _params("job_slowdown", ci=False))
def test_a_job_wide_slowdown_names_no_rank(layout: str, tmp_path: Path) -> None:
    _, step = _draw(layout, "job_slowdown")
    print(f"{layout}: every rank slow from step {step} for 10 steps, seed {SEED}")
    records = _run(layout, "job_slowdown", None, step, steps=step + 12, window=10, tmp=tmp_path)
    assert all(not r.outliers for r in records), _summary(records)
    if layout == "ddp2":  # the pair: both slower than their own history, said once
        assert [(r.failure.value, r.scope.value) for r in records] == [("straggler", "group")], (
            _summary(records)
        )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", _params("one_slow_step", ci=False))
def test_one_slow_step_on_one_rank_names_no_rank(layout: str, tmp_path: Path) -> None:
    victim, step = _draw(layout, "one_slow_step")
    print(f"{layout}: victim rank {victim}, one slow step {step}, seed {SEED}")
    records = _run(
        layout, "compute_straggler", victim, step, steps=step + 5, window=1, tmp=tmp_path
    )
    assert records == [], _summary(records)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", _params("clean", ci=False))
def test_forty_clean_steps_give_no_record(layout: str, tmp_path: Path) -> None:
    records = _run(layout, "clean", None, 20, steps=40, window=4, tmp=tmp_path)
    assert records == [], _summary(records)
