"""Referee replay on real layouts with two copies (Gloo, CPU): one flipped bit in the
victim's block output (training and replay calls, through a forward hook) makes the
pair's ``forward`` differ with equal inputs and parameters. A third rank recomputes
the round from shipped state and the pair names exactly the victim, rank scope, in the
first round that replays the struck block (HSDP 2 x 2, DP 2 x TP 2; and with 2 pipeline
stages x DP 2, where the referee sits in the other stage and names its blocks by other
paths). Under DDP x 2 in a world of 2 no third rank exists: group scope with the "no
referee" reason. A referee that stalls past the timeout, or dies, leaves the pair group
scope with the reason, names no one, and the pair leaves the boundary within the
timeout. Point-to-point traffic appears only at the disagreeing round, and only on the
three ranks involved.

The victim rank, the struck block, the bit and the first faulty step come from the
seed in each test id (printed, so a failure can be replayed).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing.harness import RankFailedError, retry_on_port_clash, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
LAYERS = ("layers.0", "layers.1", "layers.2", "layers.3")
PAIRS = {"hsdp": [(0, 2), (1, 3)], "dptp": [(0, 2), (1, 3)], "ddp": [(0, 1)]}
"""Replica pairs of each layout (HSDP: rank = 2 r + s; DP x TP: rank = 2 d + t)."""
HEADER_BYTES = 8192
ANSWER_BYTES = 64


def _draw(seed: int, world: int) -> dict[str, Any]:
    rng = random.Random(seed)
    spec = {
        "victim": rng.randrange(world),
        "layer": rng.choice(LAYERS),
        "bit": rng.choice([0, 12, 22]),
        "start": rng.randrange(2, 5),
    }
    spec["steps"] = spec["start"] + 6
    print(f"seed {seed}: {spec}")
    return spec


def _run(layout: str, world: int, spec: dict[str, Any], timeout_s: float) -> list[Any]:
    from referee_scenarios import torch_body

    return retry_on_port_clash(
        lambda: run_ranks(torch_body, world, args=(layout, spec), timeout_s=timeout_s, env=ENV)
    )


def _pair_of(layout: str, rank: int) -> tuple[int, int]:
    return next(p for p in PAIRS[layout] if rank in p)


def _referee_of(layout: str, pair: tuple[int, int], step: int) -> int:
    """The documented choice on a layout of two pairs: the other pair's member at the
    position of the source (``pair[step % 2]``, rotating with the step)."""
    other = next(p for p in PAIRS[layout] if p != pair)
    return other[step % 2]


def _first_round(results: list[Any], spec: dict[str, Any]) -> int:
    """The first step at or after the fault whose hidden round replayed the struck block."""
    victim = results[spec["victim"]]
    steps = [s for s, path in victim["rounds"] if path == spec["layer"] and s >= spec["start"]]
    assert steps, f"the struck block was never replayed after the fault: {victim['rounds']}"
    return min(steps)


def _check_named(
    layout: str, results: list[Any], spec: dict[str, Any], *, traffic: bool = True
) -> None:
    victim = spec["victim"]
    pair = _pair_of(layout, victim)
    fired = results[victim]["fired"]
    assert fired and fired[0][2] == spec["start"], f"the fault did not fire at the start: {fired}"
    first = _first_round(results, spec)
    # Named exactly: every record of any rank that names a culprit names the victim.
    for res in results:
        for v in res["verdicts"]:
            assert v["outliers"] in ([], [victim]), v
    refereed = [v for r in pair for v in results[r]["verdicts"] if "referee" in v["detail"]]
    assert refereed, [v for r in pair for v in results[r]["verdicts"]]
    earliest = min(v["step"] for v in refereed)
    assert earliest == first, (earliest, first)
    for v in refereed:
        assert (v["failure"], v["scope"], v["status"]) == ("sdc", "rank", "attributed"), v
        assert v["outliers"] == [victim] and v["group"] == list(pair), v
        assert v["detail"]["module"] == spec["layer"], v
        referee = v["detail"]["referee"]
        assert referee == _referee_of(layout, pair, v["step"]), v
        healthy = next(r for r in pair if r != victim)
        assert v["detail"]["healthy"] == healthy, v
        sigs = v["detail"]["signatures"]
        assert set(sigs) == {str(victim), str(healthy), str(referee)}, v
        # the referee recomputed the healthy copy's result, not the victim's
        assert sigs[str(referee)] == sigs[str(healthy)] != sigs[str(victim)], v
    # Every pair member reached the same verdict at the first struck round.
    at_first = [
        [
            v["outliers"]
            for v in results[r]["verdicts"]
            if v["step"] == first and "referee" in v["detail"]
        ]
        for r in pair
    ]
    assert at_first[0] == at_first[1] and at_first[0], at_first
    if traffic:
        _check_traffic(results, refereed, first)


def _check_traffic(results: list[Any], refereed: list[dict[str, Any]], first: int) -> None:
    pair = tuple(refereed[0]["group"])
    # Healthy rounds pay nothing: no point-to-point call at any boundary before the first
    # disagreement, on any rank; at it, only the pair and its referee talk.
    referee = next(v["detail"]["referee"] for v in refereed if v["step"] == first)
    for res in results:
        assert all(calls == [] for calls in res["p2p"][:first]), (res["rank"], res["p2p"])
        if res["rank"] not in (*pair, referee):
            assert res["p2p"][first] == [], (res["rank"], res["p2p"][first])
    # At it: the source ships a header and one payload, the referee answers each member.
    source = pair[first % 2]
    other = next(r for r in pair if r != source)
    shipped = results[source]["p2p"][first]
    assert [c[0] for c in shipped] == ["isend", "isend", "irecv"], shipped
    payload = shipped[1][1]
    print(f"referee payload: {payload} bytes, header {shipped[0][1]} bytes")
    assert shipped[0][1] == HEADER_BYTES and shipped[2][1] == ANSWER_BYTES, shipped
    assert results[referee]["p2p"][first] == [
        ["irecv", HEADER_BYTES],
        ["irecv", payload],
        ["isend", ANSWER_BYTES],
        ["isend", ANSWER_BYTES],
    ]
    assert results[other]["p2p"][first] == [["irecv", ANSWER_BYTES]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [3])
def test_compute_sdc_named_by_a_referee_hsdp2x2(seed: int) -> None:
    spec = _draw(seed, 4)
    _check_named("hsdp", _run("hsdp", 4, spec, 240), spec)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [8])
def test_compute_sdc_named_by_a_referee_dp2xtp2(seed: int) -> None:
    spec = _draw(seed, 4)
    _check_named("dptp", _run("dptp", 4, spec, 240), spec)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("layout", "seed"), [(lay, s) for lay in ("hsdp", "dptp") for s in (21, 22, 23)]
)
def test_compute_sdc_named_by_a_referee(layout: str, seed: int) -> None:
    spec = _draw(seed, 4)
    _check_named(layout, _run(layout, 4, spec, 300), spec)


def _check_unnamed(results: list[Any], spec: dict[str, Any]) -> None:
    first = _first_round(results, spec)
    records = [v for res in results for v in res["verdicts"] if v["failure"] == "sdc"]
    assert records, "the pair saw no disagreement"
    assert min(v["step"] for v in records) == first
    for v in records:
        assert (v["scope"], v["status"], v["outliers"]) == ("group", "inconclusive", []), v
        assert v["detail"]["referee"] is None, v
        assert v["detail"]["reason"].startswith("no referee"), v


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [5])
def test_ddp2_in_a_world_of_two_has_no_referee(seed: int) -> None:
    spec = _draw(seed, 2)
    results = _run("ddp", 2, spec, 240)
    _check_unnamed(results, spec)
    for res in results:  # no third rank: nothing moved
        assert all(calls == [] for calls in res["p2p"]), res["p2p"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("layout", "world", "seed"),
    # DDP's skip runs in CI with the stalled referee (a group-scope SDC there too)
    [("hsdp", 4, 3), pytest.param("ddp", 2, 5, marks=pytest.mark.slow)],
)
def test_the_gate_retrieves_on_a_refereed_sdc_and_only_skips_an_unrefereed_one(
    layout: str, world: int, seed: int
) -> None:
    """Issue 35, the gate: a refereed verdict is a localized SDC for Algorithm 3, so the
    job selects verified state (HSDP 2 x 2); the same fault with no referee (DDP x 2 in
    a world of 2) is a group-scope SDC, which never certifies but selects nothing."""
    spec = _draw(seed, world)
    spec["gate"] = True
    results = _run(layout, world, spec, 240)
    first = _first_round(results, spec)
    for res in results:  # every rank's gate decided the same; clean before the fault
        assert res["gate"] == results[0]["gate"], (res["rank"], res["gate"])
        before = {a for step, a in res["gate"] if step < first}
        assert before and before <= {"capture", "rotate"}, res["gate"]
    if layout == "ddp":
        _check_unnamed(results, spec)
        for res in results:  # not clean: the cycle restarts, nothing is selected
            assert dict(res["gate"]).get(first) == "skip", res["gate"]
            assert "retrieve" not in {a for _, a in res["gate"]}, res["gate"]
            assert res["pending"] is None, res["pending"]
        return
    _check_named(layout, results, spec, traffic=False)  # the gate replicates point to point
    for res in results:  # a localized SDC: every rank selects verified state
        assert dict(res["gate"]).get(first) == "retrieve", res["gate"]
        assert res["pending"] is not None and res["pending"].startswith("sdc"), res["pending"]


STALL_TIMEOUT_S = 1.0
"""``referee_timeout_s`` of the stalled and killed referee tests (the lowest allowed)."""
STALL_S = 6.0
"""How long the stalled referee sleeps before its part: six timeouts."""
SLACK_S = 3.5
"""What a pair member's step may take beyond the timeout (the step's own work, under
load), well short of the stall."""


def _check_unsettled(v: dict[str, Any], pair: tuple[int, int], referee: int) -> None:
    """A pair's record after a referee that did not answer: group scope, the reason."""
    assert (v["failure"], v["scope"], v["status"]) == ("sdc", "group", "inconclusive"), v
    assert v["outliers"] == [] and v["group"] == list(pair), v
    assert v["detail"]["referee"] == referee, v
    assert v["detail"]["reason"].startswith(f"referee rank {referee} did not answer"), v
    assert "healthy" not in v["detail"], v
    # the referee gave no signature: only the pair's own two are shown
    assert set(v["detail"]["signatures"]) == {str(r) for r in pair}, v


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [3])
def test_a_stalled_referee_leaves_the_pair_group_scope_within_the_timeout(seed: int) -> None:
    spec = _draw(seed, 4)
    spec.update(referee="stall", timeout_s=STALL_TIMEOUT_S, stall_s=STALL_S, gate=True)
    results = _run("hsdp", 4, spec, 240)
    victim = spec["victim"]
    pair = _pair_of("hsdp", victim)
    first = _first_round(results, spec)
    referee = _referee_of("hsdp", pair, first)
    print("stalled, by rank:", [res["misbehaved"] for res in results])
    assert results[referee]["misbehaved"] == 1, "the referee never stalled"
    # Nobody is named on any surface, by any rank.
    for res in results:
        for v in res["verdicts"]:
            assert v["outliers"] == [] or v["failure"] == "straggler", (res["rank"], v)
            assert v["failure"] != "sdc" or v["scope"] == "group", (res["rank"], v)
    for r in pair:
        refereed = [v for v in results[r]["verdicts"] if "referee" in v["detail"]]
        assert refereed, (r, results[r]["verdicts"])
        assert min(v["step"] for v in refereed) == first, (r, refereed)
        for v in refereed:
            if v["step"] == first:
                _check_unsettled(v, pair, referee)
            else:  # the failed group is never used again on this rank
                assert v["outliers"] == [] and v["scope"] == "group", v
                assert v["detail"]["reason"].startswith("the referee group failed earlier"), v
        # The pair waited for the timeout, not for the referee: each member emitted its
        # record at the first struck round well before the stalled referee woke.
        waits = [s for step, _, s in results[r]["refereed_s"] if step == first]
        assert waits, results[r]["refereed_s"]
        print(f"rank {r}: step {first} to its record: {max(waits):.2f} s")
        assert STALL_TIMEOUT_S <= max(waits) < STALL_TIMEOUT_S + SLACK_S < STALL_S, waits
    for res in results:
        # Training went on: every rank ran every step.
        assert res["trained"] == spec["steps"], res
        # The gate: a group-scope SDC is not clean, so the cycle restarts (skip), but
        # nothing says which copy is right, so nothing is selected.
        assert res["gate"] == results[0]["gate"], (res["rank"], res["gate"])
        assert dict(res["gate"]).get(first) == "skip", res["gate"]
        assert "retrieve" not in {a for _, a in res["gate"]}, res["gate"]
        assert res["pending"] is None, res["pending"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [8])
def test_a_killed_referee_leaves_the_pair_group_scope_and_no_hang(
    seed: int, tmp_path: Path
) -> None:
    from referee_scenarios import torch_body

    spec = _draw(seed, 4)
    spec.update(referee="die", timeout_s=STALL_TIMEOUT_S)
    tries: list[Path] = []

    def attempt() -> list[Any]:
        where = tmp_path / f"try-{len(tries)}"
        where.mkdir()
        tries.append(where)
        env = {**ENV, "SCOUT_TEST_RANK_DIR": str(where)}
        return run_ranks(torch_body, 4, args=("hsdp", spec), timeout_s=240, env=env)

    started = time.monotonic()
    # The dead rank fails the job (training needs it); the harness then stops the rest.
    with pytest.raises(RankFailedError) as failed:
        retry_on_port_clash(attempt)
    print(f"the job ended {time.monotonic() - started:.1f} s after it started")
    where = tries[-1]
    died = sorted(int(f.name.split("-")[1]) for f in where.glob("died-*"))
    assert len(died) == 1, died
    referee = died[0]
    assert f"rank {referee} (exit 17)" in str(failed.value)
    pair = _pair_of("hsdp", spec["victim"])
    assert referee not in pair
    # Each pair member reached its verdict on its own (and left: exit 0), within the
    # timeout of the step that asked, naming no one.
    got = {}
    for r in pair:
        path = where / f"survivor-{r}.json"
        assert path.exists(), f"rank {r} never reached a verdict:\n{failed.value}"
        got[r] = json.loads(path.read_text())
        assert f"rank {r} (exit 0)" in str(failed.value)
    steps = {got[r]["verdict"]["step"] for r in pair}
    assert len(steps) == 1, got
    step = steps.pop()
    assert step >= spec["start"], got
    assert referee == _referee_of("hsdp", pair, step)
    for r in pair:
        v = got[r]["verdict"]
        assert v["detail"]["module"] == spec["layer"], v
        _check_unsettled(v, pair, referee)
        print(f"rank {r}: step {step} to its record: {got[r]['step_s']:.2f} s")
        assert got[r]["step_s"] < STALL_TIMEOUT_S + SLACK_S, got[r]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("victim", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_pipeline_pair_is_refereed_from_the_other_stage(victim: int, tmp_path: Path) -> None:
    """DeepSpeed's 2 stages x DP 2 (rank = stage * 2 + data index): each stage's replica
    pair has no third copy, so its referee is a rank of the other stage, whose blocks
    have other paths (the campaign's compute SDC on ``victim`` from step 2)."""
    from scout_core.campaign.pair_layouts import PAIR_LAYOUTS
    from scout_core.campaign.plan import Trial, missing_module
    from scout_core.campaign.runner import run_trial
    from scout_core.records.reading import load_report
    from scout_core.records.record import VERDICT_SCHEMA

    setup = PAIR_LAYOUTS.get("pp2xdp2")
    if setup is None or missing_module(setup) is not None:
        pytest.skip("the DeepSpeed plugin's pipeline setup is not installed")
    trial = Trial(0, "pp2xdp2", "compute_sdc", victim, 2, 8, setup.world)
    score = run_trial(trial, setup, tmp_path, fault={}, settings={"replay_interval": 1})
    assert score.error is None, score.error
    report = load_report(tmp_path / "trial-000-pp2xdp2-compute_sdc", strict=False)
    sdc = [r for r in report.records if r.failure is not None and r.failure.value == "sdc"]
    # no record of any kind (verdict or incident) names a rank but the victim
    assert {o for r in sdc for o in r.outliers} == {victim}, [r.outliers for r in sdc]
    sdc = [r for r in sdc if r.schema == VERDICT_SCHEMA]
    assert sdc, "the pair saw no disagreement"
    pair = (victim // 2 * 2, victim // 2 * 2 + 1)
    healthy = pair[1] if victim == pair[0] else pair[0]
    for r in sdc:
        assert tuple(r.group) == pair, r
        assert (r.scope.value, list(r.outliers)) == ("rank", [victim]), r
        referee = r.detail["referee"]
        assert referee // 2 != victim // 2, r  # the other stage
        assert r.detail["healthy"] == healthy, r
        sigs = r.detail["signatures"]
        assert sigs[str(referee)] == sigs[str(healthy)] != sigs[str(victim)], r
    assert min(r.step for r in sdc) == 2
