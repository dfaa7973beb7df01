"""Buddy optimizer replay on layouts with one copy of the optimizer state (Gloo, CPU):
pure FSDP2 x 4 and DeepSpeed ZeRO 1-3 x 4. On one rank, from a drawn step on, the
optimizer step computes from a corrupted gradient (a miscomputed update: SCOUT's
snapshot holds the clean gradient); its buddy's replay differs from its post-step slice,
the referee sides with the buddy, and the owner is named exactly (``optimizer/buddy``,
rank scope) within one rotation of the optimizer slice. Custody does not see it (the
step wrote the wrong value). Clean runs give no record; with the gate on, the buddy
verdict makes the gate select verified state.

The victim, the element, the bit and the first faulty step come from the seed in each
test id (printed, so a failure can be replayed).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing.harness import retry_on_port_clash, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
SCOUT = {
    "recipes": ["optimizer"],
    "optimizer_interval": 1,
    "optimizer_slice": 8192,
    "custody_slices": 0,
}
"""The optimizer recipe alone, at every step, on a slice of 8,192 elements: TinyLM's
local partitions take a few steps to rotate through (the tests read how many)."""
PARAMS = ("embed.weight", "layers.1.fc1.weight", "layers.3.fc2.weight", "head.weight")


def _draw(seed: int, params: tuple[str, ...]) -> dict[str, Any]:
    rng = random.Random(seed)
    spec: dict[str, Any] = {
        "victim": rng.randrange(4),
        "param": rng.choice(params),
        "index": rng.randrange(1 << 10),  # taken modulo the victim's local elements
        "bit": rng.choice([7, 20, 30]),
        "start": rng.randrange(2, 5),
        "fault": "grad",
        "slices": 0,
        "scout": SCOUT,
    }
    spec["steps"] = spec["start"] + 12
    print(f"seed {seed}: {spec}")
    return spec


def _run(body: str, arg: Any, spec: dict[str, Any], timeout_s: float) -> list[Any]:
    from custody_scenarios import deepspeed_body, torch_body

    fn = {"torch": torch_body, "deepspeed": deepspeed_body}[body]
    return retry_on_port_clash(
        lambda: run_ranks(fn, 4, args=(arg, spec), timeout_s=timeout_s, env=ENV)
    )


def _check_named(results: list[Any], spec: dict[str, Any]) -> None:
    victim, start = spec["victim"], spec["start"]
    fired = results[victim]["fired"]
    assert fired and fired[0][2] == start, f"the fault did not fire from step {start}: {fired}"
    for res in results:
        for v in res["verdicts"]:
            if v["outliers"]:
                assert v["outliers"] == [victim], v  # named exactly, nobody else
    buddy = [v for res in results for v in res["verdicts"] if v["surface"] == "optimizer/buddy"]
    assert buddy, "buddy replay named no one"
    first = min(buddy, key=lambda v: v["step"])
    assert (first["failure"], first["scope"], first["status"]) == ("sdc", "rank", "attributed")
    # Within one rotation of the victim's optimizer slices from the first faulty step.
    assert start <= first["step"] < start + results[victim]["slices"], first


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [61])
def test_a_miscomputed_update_is_named_by_its_buddy_fsdp2x4(seed: int) -> None:
    spec = _draw(seed, PARAMS)
    _check_named(_run("torch", "fsdp", spec, 240), spec)


@pytest.mark.timeout(500)
@pytest.mark.parametrize(
    ("stage", "seed"),
    [
        pytest.param(1, 71, marks=pytest.mark.slow),
        pytest.param(2, 72, marks=pytest.mark.slow),
        (3, 73),
    ],
)
def test_a_miscomputed_update_is_named_by_its_buddy_zero(stage: int, seed: int) -> None:
    pytest.importorskip("deepspeed")
    spec = _draw(seed, ("#0.0",))
    _check_named(_run("deepspeed", stage, spec, 420), spec)


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.parametrize(("body", "arg"), [("torch", "fsdp"), ("deepspeed", 1), ("deepspeed", 3)])
def test_forty_clean_steps_give_no_buddy_record(body: str, arg: Any) -> None:
    if body == "deepspeed":
        pytest.importorskip("deepspeed")
    spec = {"victim": None, "slices": 0, "steps": 40, "scout": SCOUT}
    for res in _run(body, arg, spec, 420):
        assert res["verdicts"] == [], res["verdicts"][:3]
        assert res["buddy_agreed"] >= 30, res["buddy_agreed"]  # compared, not skipped


@pytest.mark.timeout(300)
def test_gate_selects_verified_state_on_a_buddy_verdict() -> None:
    """FSDP2 x 4, the gate on: the optimizer recipe is outside the gate's catalog where
    state is owned once, but the buddy verdict is kept on the named rank like a custody
    verdict, and the gate selects verified state on every rank."""
    spec = _draw(62, PARAMS)
    spec["gate"] = True
    spec["scout"] = {**SCOUT, "recipes": ["hidden", "optimizer"], "replay_interval": 1}
    results = _run("torch", "fsdp", spec, 240)
    _check_named(results, spec)
    for res in results:
        assert res["pending"] is not None and res["pending"].startswith("sdc"), res["pending"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("victim", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_pipeline_pair_s_optimizer_step_is_refereed_from_the_other_stage(
    victim: int, tmp_path: Path
) -> None:
    """DeepSpeed's 2 stages x DP 2 (ZeRO-1; rank = stage * 2 + data index): each stage's
    optimizer partitions are owned once in a pair, so the buddy's referee is the rank at
    the same position of the other stage (the campaign's ``optimizer_sdc`` on ``victim``
    at step 2: a moment flipped after SCOUT's snapshot, so the step computes from it)."""
    from scout_core.campaign.pair_layouts import PAIR_LAYOUTS
    from scout_core.campaign.plan import Trial, missing_module
    from scout_core.campaign.runner import run_trial
    from scout_core.records.reading import load_report
    from scout_core.records.record import VERDICT_SCHEMA

    setup = PAIR_LAYOUTS.get("pp2xdp2")
    if setup is None or missing_module(setup) is not None:
        pytest.skip("the DeepSpeed plugin's pipeline setup is not installed")
    trial = Trial(0, "pp2xdp2", "optimizer_sdc", victim, 2, 6, setup.world)
    settings = {"replay_interval": 1, "optimizer_interval": 1}
    score = run_trial(trial, setup, tmp_path, fault={}, settings=settings)
    assert score.error is None, score.error
    report = load_report(tmp_path / "trial-000-pp2xdp2-optimizer_sdc", strict=False)
    sdc = [r for r in report.records if r.failure is not None and r.failure.value == "sdc"]
    assert {o for r in sdc for o in r.outliers} == {victim}, [r.outliers for r in sdc]
    buddy = [r for r in sdc if r.schema == VERDICT_SCHEMA and r.surface == "optimizer/buddy"]
    assert buddy, "the pair's buddy round named no one"
    pair = (victim // 2 * 2, victim // 2 * 2 + 1)
    healthy = pair[1] if victim == pair[0] else pair[0]
    for r in buddy:
        assert tuple(r.group) == pair, r
        assert (r.scope.value, list(r.outliers)) == ("rank", [victim]), r
        referee = r.detail["referee"]
        assert referee // 2 != victim // 2 and referee % 2 == victim % 2, r  # other stage
        sigs = r.detail["signatures"]
        assert sigs[str(referee)] == sigs[str(healthy)] != sigs[str(victim)], r
    assert min(r.step for r in buddy) == 2
