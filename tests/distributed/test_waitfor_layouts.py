"""The wait-for graph, end to end, where no vote can decide: two copies per peer group.

Layouts (each a real training job of ``scout campaign``'s rank bodies, Gloo on CPU):
DDP x 2, HSDP 2 x 2 (FSDP2), DP 2 x TP 2 (DTensor TP + DDP), and 2 pipeline stages x
DP 2 (DeepSpeed ``PipelineEngine``). Every peer group holds two replicas, so a vote
names nobody; the observers' wait-for graph must name the victim.

* Each hang-class fault (SIGSTOP, a held GIL, a mismatched collective, a DataLoader
  stall, a checkpoint-write stall) strikes a victim rank at a step, both drawn from the
  seed in the test id (``SCOUT_TEST_SEED``, else the day's number, so the draws change
  from day to day and a failure is replayed by setting the seed): exactly the victim is
  named, with the fault's class, within ``hang_timeout_s`` + 2 s of the fault (the
  trial's own stamp against the record's time); every other rank is listed as waiting
  in the record, never named.
* A collective held open with every member inside it: a ``group_stall`` naming that
  group, no rank.
* 40 clean steps: no record.

CI runs one fault per layout, one layout's collective stall and one layout's clean run,
each drawn from the same seed; the rest is marked ``slow`` (``scripts/test.sh -m slow``).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from scout_core.campaign.config import HANG_TIMEOUT_S
from scout_core.campaign.pair_layouts import PAIR_LAYOUTS
from scout_core.campaign.plan import FIRST_STEP, Setup, Trial, missing_module
from scout_core.campaign.runner import run_trial
from scout_core.records.reading import load_report
from scout_core.records.record import VERDICT_SCHEMA

pytestmark = pytest.mark.distributed

SEED = int(
    os.environ.get("SCOUT_TEST_SEED") or time.gmtime().tm_yday + 1000 * time.gmtime().tm_year
)
"""The seed of every draw here (module doc)."""

LAYOUTS: dict[str, Setup] = dict(PAIR_LAYOUTS)
STALLED: dict[str, list[int]] = {
    "ddp2": [0, 1],  # the data-parallel group: the whole job
    "hsdp2x2": [0, 1],  # a shard group (FSDP's all-gathers and reduce-scatters)
    "dp2xtp2": [2, 3],  # a TP group
    "pp2xdp2": [0, 1],  # stage 0's data-parallel group (DeepSpeed: rank = stage * 2 + dp)
}
"""The aligned group a collective stall holds open, per layout."""
KINDS = {
    "hang_sigstop": "hang",
    "hang_gil": "hang",
    "protocol_mismatch": "protocol_mismatch",
    "input_stall": "input_stall",
    "checkpoint_stall": "checkpoint_stall",
}
"""Each fault kind and the failure class that names its victim."""

_draw = random.Random(SEED)
_CI_KIND = {layout: _draw.choice(sorted(KINDS)) for layout in LAYOUTS}
_CI_STALL = _draw.choice(sorted(LAYOUTS))
_CI_CLEAN = _draw.choice(sorted(LAYOUTS))


def _params(picked: Any, pairs: list[tuple[str, ...]]) -> list[Any]:
    return [
        pytest.param(
            *pair,
            id=f"{'-'.join(pair)}-seed{SEED}",
            marks=() if picked(*pair) else pytest.mark.slow,
        )
        for pair in pairs
    ]


def _setup(layout: str) -> Setup:
    setup = LAYOUTS[layout]
    missing = missing_module(setup)
    if missing is not None:
        pytest.skip(f"{missing} is not installed")
    return setup


def _trial(layout: str, kind: str, victim: int, step: int, steps: int) -> Trial:
    world = LAYOUTS[layout].world
    return Trial(0, layout, kind, victim, step, steps, world)


def _failing(report_dir: Path) -> list[Any]:
    if not report_dir.is_dir():
        return []
    report = load_report(report_dir, strict=False)
    return [r for r in report.records if r.schema == VERDICT_SCHEMA and r.failure is not None]


def _summary(records: list[Any]) -> list[Any]:
    return [(r.step, r.failure.value, list(r.group), list(r.outliers), r.detail) for r in records]


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("layout", "kind"),
    _params(lambda lay, kind: _CI_KIND[lay] == kind, [(lay, k) for lay in LAYOUTS for k in KINDS]),
)
def test_a_hang_class_fault_names_exactly_its_victim(
    layout: str, kind: str, tmp_path: Path
) -> None:
    setup = _setup(layout)
    draw = random.Random(f"{SEED}:{layout}:{kind}")
    victim, step = draw.randrange(setup.world), draw.randrange(FIRST_STEP, FIRST_STEP + 2)
    print(f"{layout} {kind}: victim rank {victim}, step {step}, seed {SEED}")
    score = run_trial(_trial(layout, kind, victim, step, step + 5), setup, tmp_path)
    records = _failing(tmp_path / f"trial-000-{layout}-{kind}")
    assert score.error is None, score.error
    assert score.outcome == "detected", _summary(records)
    expected = KINDS[kind]
    assert {(r.failure.value, tuple(r.outliers)) for r in records} == {(expected, (victim,))}, (
        _summary(records)
    )
    assert score.ttv_s is not None and score.ttv_s <= HANG_TIMEOUT_S + 2.0, score.ttv_s
    others = {str(r) for r in range(setup.world) if r != victim}
    first = min(records, key=lambda r: r.time)
    if kind != "protocol_mismatch":  # the mismatch's partners sit in it, waiting for nobody
        assert set(first.detail.get("waiting", {})) == others, _summary(records)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "layout", _params(lambda lay: lay == _CI_STALL, [(lay,) for lay in LAYOUTS])
)
def test_a_collective_held_open_with_every_member_inside_names_the_group(
    layout: str, tmp_path: Path
) -> None:
    setup = _setup(layout)
    step = random.Random(f"{SEED}:{layout}:stall").randrange(FIRST_STEP, FIRST_STEP + 2)
    trial = _trial(layout, "collective_stall", -1, step, step + 3)
    payload_ranks = STALLED[layout]
    score = run_trial(trial, setup, tmp_path, fault={"ranks": payload_ranks})
    records = _failing(tmp_path / f"trial-000-{layout}-collective_stall")
    assert score.error is None, score.error
    assert records, "no record"
    assert all(not r.outliers for r in records), _summary(records)
    assert {r.failure.value for r in records} == {"group_stall"}, _summary(records)
    for r in records:  # the stalled group: the record's own group, or the one it found
        named = [list(r.group)] if r.detail.get("stalled") is None else r.detail["stalled"]
        assert named == [payload_ranks], _summary(records)
        whole = len(payload_ranks) == setup.world
        assert r.scope.value == ("job" if whole else "group"), _summary(records)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "layout", _params(lambda lay: lay == _CI_CLEAN, [(lay,) for lay in LAYOUTS])
)
def test_forty_clean_steps_give_no_record(layout: str, tmp_path: Path) -> None:
    setup = _setup(layout)
    score = run_trial(Trial(0, layout, "clean", None, 20, 40, setup.world), setup, tmp_path)
    assert score.error is None, score.error
    assert score.outcome == "clean"
    assert _failing(tmp_path / f"trial-000-{layout}-clean") == []
