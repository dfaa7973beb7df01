"""SCOUT on real DeepSpeed engines (Gloo, CPU): ZeRO 1/2/3, PipelineEngine, activation.

Each ZeRO stage runs one 15-step job with replay of one hidden layer per step (4
layers: layer ``k`` is sampled at steps ``k, k+4, ...``) and three faults:

* rank 2: every call of ``layers.1`` flips the lowest mantissa bit of its output
  (a persistent compute SDC) → ``sdc`` naming rank 2 at steps 1, 5, 9, 13;
* rank 3: the layer sampled at steps 6-8 sleeps 200 ms (a compute straggler) →
  ``straggler`` naming rank 3 once two consecutive rounds confirm it (steps 7, 8);
* rank 1: at step 10, one low bit of ``layers.2.fc1.weight`` is flipped in its real
  storage. ZeRO 1/2: the module copy, replicated → ``sdc`` on rank 1's
  ``layers.2/params`` at step 10, and the next parameter all-gather rewrites the
  copy, so step 14 (``layers.2`` again) is clean. ZeRO-3: rank 1's partition, the
  only copy of that shard; every rank gathers the same corrupted value, so peers
  agree and nothing is reported: never a wrong rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scout_core.testing import ran_every_due_round, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}

FAULTS: list[dict[str, Any]] = [
    {"rank": 2, "persistent": True, "kind": "output", "target": "layers.1", "bit": 0},
    *(
        {"rank": 3, "step": s, "kind": "delay", "target": f"layers.{s % 4}", "seconds": 0.2}
        for s in (6, 7, 8)
    ),
    {"rank": 1, "step": 10, "kind": "param", "target": "layers.2.fc1.weight", "bit": 0},
]


def _same_everywhere(results: list[Any]) -> list[dict[str, Any]]:
    """Every rank of one peer group learns the same verdicts; return rank 0's."""

    def key(res: Any) -> list[tuple[Any, ...]]:
        return [(v["step"], v["surface"], v["failure"], v["outliers"]) for v in res["verdicts"]]

    for res in results[1:]:
        assert key(res) == key(results[0])
    verdicts: list[dict[str, Any]] = results[0]["verdicts"]
    return verdicts


@pytest.mark.timeout(240)
# CI runs ZeRO-1 and ZeRO-3 here (ZeRO-2 shares ZeRO-1's replicated module copy) and the
# ZeRO-3 clean run below; the other stages run under ``-m slow``.
@pytest.mark.parametrize("stage", [1, pytest.param(2, marks=pytest.mark.slow), 3])
def test_zero_stage_localizes_sdc_and_straggler(stage: int) -> None:
    from ds_scenarios import scenario

    results = run_ranks(
        scenario, 4, args=(stage, FAULTS, 15, {"recipes": ["hidden"]}), timeout_s=200, env=ENV
    )
    assert all(r["steps"] == 15 for r in results)
    assert ["param", "layers.2.fc1.weight", 10] in results[1]["fired"]
    verdicts = _same_everywhere(results)
    assert all(v["status"] == "attributed" and v["scope"] == "rank" for v in verdicts)
    assert all(v["group"] == [0, 1, 2, 3] for v in verdicts)

    sdc1 = [
        (v["step"], v["surface"], v["outliers"]) for v in verdicts if "layers.1/" in v["surface"]
    ]
    assert sdc1 == [(s, "layer/layers.1/forward", [2]) for s in (1, 5, 9, 13)]

    slow = [
        (v["step"], v["surface"], v["failure"], v["outliers"])
        for v in verdicts
        if v["failure"] == "straggler"
    ]
    assert slow == [
        (7, "layer/layers.3/t_M", "straggler", [3]),
        (8, "layer/layers.0/t_M", "straggler", [3]),
    ]

    param = [v for v in verdicts if "layers.2/" in v["surface"]]
    if stage in (1, 2):
        assert {v["step"] for v in param} == {10}  # step 14 is clean: the all-gather healed it
        assert all(v["failure"] == "sdc" and v["outliers"] == [1] for v in param)
        assert "layer/layers.2/params" in {v["surface"] for v in param}
    else:
        # A ZeRO-3 partition has one owner: its peers all-gather the owner's (corrupted)
        # value, so replay has nothing to compare it with. Whatever is found there must
        # name the owner, never a peer.
        assert all(v["outliers"] == [1] for v in param)
    assert {v["surface"].split("/")[1] for v in verdicts} <= {
        "layers.0",
        "layers.1",
        "layers.2",
        "layers.3",
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "stage", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3]
)
def test_clean_run_is_silent_and_bitwise_identical(stage: int) -> None:
    from ds_scenarios import clean_and_bitwise

    results = run_ranks(clean_and_bitwise, 4, args=(stage, 30), timeout_s=200, env=ENV)
    for res in results:
        assert res["on_attached"] and not res["off_attached"]
        assert res["verdicts"] == []  # no attributed or inconclusive record in 30 steps
        # every due round ran, the optimizer's too (buddy replay: partitions are owned once)
        assert ran_every_due_round(res, 30)
        assert res["surfaces"] == [
            "layer/embed",
            "layer/head",
            "layer/layers.0",
            "layer/layers.1",
            "layer/layers.2",
            "layer/layers.3",
            "optimizer",
        ]
        assert res["on"] == res["off"]
        assert res["on_losses"] == res["off_losses"]


@pytest.mark.timeout(240)
def test_activation_conformance_and_bad_sections(tmp_path: Path) -> None:
    from ds_scenarios import activation

    results = run_ranks(
        activation, 3, args=(3, str(tmp_path / "ds_config.json")), timeout_s=200, env=ENV
    )
    for out in results:
        assert "unknown key 'replay_intervall'" in out["unknown"]
        assert "'replay_interval' must be in 1..1,000,000, got -3" in out["negative"]
        assert "'kappa' must be > 0 and <= 100, got 0.0" in out["file"]
        for name in ("absent", "disabled"):
            assert out[name]["session"] and not out[name]["adapter"]
            assert out[name]["hooks"] == 0
            assert out[name]["forward_hooks"] == out["absent"]["forward_hooks_baseline"]
        assert out["enabled_forward_hooks"] > out["absent"]["forward_hooks_baseline"]
        # two post hooks: the core's step clock (the checkpoint gate subscribes to its
        # boundary events; adapters count nothing) and parameter custody's signing (on
        # by default); enabling twice adds none
        assert out["hooks_after_once"] == 2
        assert out["same_session"] and out["hooks_after_twice"] == 2
        assert out["hooks_after_close"] == 0
        assert out["ownership"] == "unique"
        assert "sizes=(1, 3, 1, 1, 1, 1)" in out["layout"]  # ZeRO-3: a 3-way shard group
        assert out["layers"] == ["layers.0", "layers.1", "layers.2", "layers.3"]
        assert out["special"] == ["embedding", "lm_head"]
        assert "data_parallel" in out["groups"]
        assert out["materialized"]["fc1.weight"] == [32, 16]
        assert out["materialized_sig"] == out["reference_sig"]  # same as GatheredParameters


@pytest.mark.timeout(240)
def test_pipeline_sdc_is_localized_within_its_stage() -> None:
    from ds_scenarios import pipeline_scenario

    faults = [{"rank": 4, "persistent": True, "kind": "output", "target": "4", "bit": 0}]
    results = run_ranks(pipeline_scenario, 6, args=(faults, 6), timeout_s=200, env=ENV)
    by_rank = {r["rank"]: r for r in results}
    for r in (0, 1, 2):
        assert by_rank[r]["stage"] == 0 and by_rank[r]["peers"] == [0, 1, 2]
        assert by_rank[r]["layers"] == ["1", "2"]
        assert by_rank[r]["verdicts"] == []
        assert by_rank[r]["rounds"] == 6
    stage1 = [by_rank[r] for r in (3, 4, 5)]
    for res in stage1:
        assert res["stage"] == 1 and res["peers"] == [3, 4, 5]
        assert res["layers"] == ["3", "4"]
    verdicts = _same_everywhere(stage1)
    # Layer "4" is the second of the stage's two layers: sampled at steps 1, 3, 5.
    assert [
        (v["step"], v["surface"], v["failure"], v["outliers"], v["scope"]) for v in verdicts
    ] == [(s, "layer/4/forward", "sdc", [4], "rank") for s in (1, 3, 5)]
    assert all(v["group"] == [3, 4, 5] for v in verdicts)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pipeline_with_two_ranks_per_stage_is_group_scoped() -> None:
    from ds_scenarios import pipeline_scenario

    faults = [{"rank": 3, "persistent": True, "kind": "output", "target": "4", "bit": 0}]
    results = run_ranks(pipeline_scenario, 4, args=(faults, 4), timeout_s=200, env=ENV)
    by_rank = {r["rank"]: r for r in results}
    assert by_rank[3]["peers"] == [2, 3]
    verdicts = by_rank[2]["verdicts"]
    assert verdicts, "the disagreement was not reported"
    for v in verdicts:
        assert v["scope"] == "group" and v["outliers"] == [] and v["group"] == [2, 3]
