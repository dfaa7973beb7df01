"""All-to-all replay through ``scout.enable`` on TinyMoE (EP 2 x expert-DP, Gloo).

Each MoE layer's dispatch and combine are replayed on SCOUT's own EP groups
(``{0,1}``, ``{2,3}``, ...) with a plan and payload drawn from seeds broadcast on the
expert-DP peer groups (``{0,2,4}``, ``{1,3,5}``), which compare what they received
exactly and their lateness into the exchange statistically. One rank made late into
every replayed all-to-all
(:meth:`scout_core.testing.injectors.Trigger.delay_all_to_all`) is a rank-scoped
``comm_straggler`` naming it, and nobody else: not its EP partner, which waited for
it in the very same calls.

CI runs 6 ranks (EP 2 x expert-DP 3, the smallest layout where a position peer group
can name a rank); the 8-rank acceptance layout (EP 2 x expert-DP 4) runs under
``slow``, with 40 clean steps of every MoE recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
SLOW_RANK = 2
DELAY_S = 0.25


def _run(world: int, faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any]) -> list[Any]:
    from moe_scenarios import scout_moe

    return run_ranks(scout_moe, world, args=("uniform", faults, steps, cfg), timeout_s=400, env=ENV)


def _verdicts(results: list[Any]) -> list[dict[str, Any]]:
    """Every rank's verdicts, once each (a group's members all see its records)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in results:
        for v in r["verdicts"]:
            key = (v["step"], v["surface"], v["failure"], tuple(v["outliers"]), tuple(v["group"]))
            seen[key] = v
    return [seen[k] for k in sorted(seen, key=str)]


def _slow_case(world: int, broken: int | None = None) -> None:
    """Rank 2 is late by 0.25 s into every replayed all-to-all from step 1 on. Its EP
    partner (rank 3) waits inside the same calls, so rank 3's time in the call is the
    longest of its position; only the lateness names the right rank.

    With ``broken``, that rank (at the other EP position, in another EP group) cannot
    build its payload at step 3: it sends zeros, and its EP partner, which received
    them, must not be blamed: both positions read that round inconclusive."""
    cfg = {"recipes": ["all_to_all"], "all_to_all_interval": 1}
    faults = [{"rank": SLOW_RANK, "step": 1, "kind": "slow_a2a", "seconds": DELAY_S}]
    if broken is not None:
        faults.append({"rank": broken, "step": 3, "kind": "a2a_payload_fails"})
    steps = 6
    results = _run(world, faults, steps, cfg)
    verdicts = _verdicts(results)
    gaps = [v for v in verdicts if v["status"] == "inconclusive"]
    if broken is not None:
        assert ["a2a_payload_fails", 3] in results[broken]["fired"]
        # One gap record per position peer group, at step 3, naming who is missing what.
        assert sorted((v["step"], v["surface"].rsplit("/", 1)[1]) for v in gaps) == [
            (3, "gap"),
            (3, "gap"),
        ], gaps
        partner = broken - 1 if broken % 2 else broken + 1
        missing = {r: why for v in gaps for r, why in v["detail"]["missing"].items()}
        assert missing == {
            str(broken): "the replayed call raised",
            str(partner): "an EP partner's part of the replayed all-to-all failed",
        }
    assert not gaps or broken is not None, gaps
    results_verdicts = [v for v in verdicts if v["status"] != "inconclusive"]
    assert {s for kind, s in results[SLOW_RANK]["fired"] if kind == "collective"} == set(
        range(1, steps)
    )
    catalog = results[0]["catalog"]
    assert catalog == [["all_to_all", "layers.0.moe"], ["all_to_all", "layers.1.moe"]]
    verdicts = results_verdicts
    assert verdicts, "the late rank was not found"
    # Every verdict is a rank-scoped comm_straggler naming rank 2 on its lateness.
    for v in verdicts:
        assert v["failure"] == "comm_straggler", v
        assert v["outliers"] == [SLOW_RANK] and v["scope"] == "rank", v
        assert v["surface"].startswith("all_to_all/layers.") and v["surface"].endswith("/t_late"), v
        assert v["group"] == list(range(0, world, 2)), v  # its expert-DP position peers
        late = v["detail"]["evidence"][v["group"].index(SLOW_RANK)]
        assert late >= 1.5 * DELAY_S, v  # late twice a round: dispatch and combine
    # Confirmed after straggler_rounds (2) consecutive rounds of the all_to_all series:
    # the fault starts at step 1, so step 2 is the first it can be. A round whose
    # lateness went missing (step 3 with ``broken``) neither confirms nor clears.
    assert min(v["step"] for v in verdicts) == 2
    expected = set(range(2, steps)) - ({3} if broken is not None else set())
    assert {v["step"] for v in verdicts} == expected
    named = {r for v in verdicts for r in v["outliers"]}
    assert named == {SLOW_RANK}  # never the partner that waited (rank 3), nor anyone else


def test_late_all_to_all_names_the_rank_ep2_by_expert_dp3() -> None:
    _slow_case(6, broken=5)


@pytest.mark.slow
def test_late_all_to_all_names_the_rank_ep2_by_expert_dp4() -> None:
    _slow_case(8)


@pytest.mark.slow
def test_forty_clean_steps_of_every_moe_recipe_ep2_by_expert_dp4(tmp_path: Path) -> None:
    """40 clean steps on 8 ranks with the router, the experts and the all-to-all
    replayed at every step: no verdict, and the all-to-all rounds all compared."""
    from moe_scenarios import UNIFORM, write_catalog

    catalog = str(tmp_path / "catalog.json")
    write_catalog(catalog, UNIFORM, 32, 2)
    cfg = {
        "moe_catalog": catalog,
        "recipes": ["router", "experts", "all_to_all"],
        "router_interval": 1,
        "expert_interval": 1,
        "all_to_all_interval": 1,
    }
    results = _run(8, [], 40, cfg)
    assert _verdicts(results) == []
    for r in results:
        kinds = [k for _, due in r["due"] for k in due]
        assert kinds.count("all_to_all") == 40, r["due"]
