"""MoE replay through ``scout.enable`` on the plain-PyTorch TinyMoE (EP 2 x expert-DP).

The schedule's ``experts`` track rotates through (MoE layer, catalog representative)
pairs of a tile-model catalog (rows 0, 15, 16, 31, 32, 63, 64 per layer: 14 targets
for the two uniform layers), the ``router`` track through the two routers. Replay
runs on SCOUT's diagnostic expert-DP peer groups (``{0,2,4}`` and ``{1,3,5}`` on 6
ranks); the model's dispatch all-to-all stays on its own training EP group.

CI runs 6 ranks (EP 2 x expert-DP 3, the smallest layout with a strict majority in
every expert-DP group); the 8-rank acceptance layout (EP 2 x expert-DP 4) runs under
``slow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scout_core.testing.harness import run_ranks
from scout_core.testing.moe_checks import distinct_verdicts

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
EXPERT_TARGETS = 14


def _catalog(tmp: Path, specs: str = "uniform") -> str:
    from moe_scenarios import HETERO, UNIFORM, write_catalog

    path = str(tmp / "catalog.json")
    n = write_catalog(path, HETERO if specs == "hetero" else UNIFORM, 32, 2)
    if specs == "uniform":
        assert n == EXPERT_TARGETS
    return path


def _run(
    world: int,
    faults: list[dict[str, Any]],
    steps: int,
    cfg: dict[str, Any],
    specs: str = "uniform",
) -> list[Any]:
    from moe_scenarios import scout_moe

    return run_ranks(scout_moe, world, args=(specs, faults, steps, cfg), timeout_s=400, env=ENV)


def _faults_case(world: int, tmp: Path, specs: str = "uniform") -> None:
    """An expert-weight fault on rank 2 (MoE layer 0) and a router fault on rank 3
    (MoE layer 1), both after step 1: each is an ``sdc`` naming its rank, the expert
    one within one rotation of the experts track, the router one on the router."""
    cfg = {
        "moe_catalog": _catalog(tmp, specs),
        "recipes": ["router", "experts"],
        "expert_interval": 1,
        "router_interval": 1,
    }
    faults = [
        {"rank": 2, "step": 1, "kind": "expert_weight", "layer": 0},
        {"rank": 3, "step": 1, "kind": "router_weight", "layer": 1},
    ]
    results = _run(world, faults, 6, cfg, specs)
    catalog = results[0]["catalog"]
    rotation = sum(1 for kind, _ in catalog if kind == "experts")
    verdicts = distinct_verdicts(results)
    expert = [v for v in verdicts if v[1].startswith("experts/layers.0.moe.experts@")]
    router = [v for v in verdicts if v[1].startswith("layer/layers.1.moe.router/")]
    assert expert and router, verdicts
    # Every verdict is an SDC naming the faulty rank of its group; nothing else.
    assert {(v[2], tuple(v[3])) for v in expert} == {("sdc", (2,))}
    assert {(v[2], tuple(v[3])) for v in router} == {("sdc", (3,))}
    assert len(expert) + len(router) == len(verdicts), verdicts
    # The first expert round after the fault (step 2) already names rank 2: well
    # within one rotation of the experts track.
    assert min(v[0] for v in expert) - 1 <= rotation
    assert {v[1].rsplit("/", 1)[1] for v in expert} >= {"params", "forward", "param_grad"}
    assert {v[1].rsplit("/", 1)[1] for v in router} >= {"forward", "weights", "topk"}


def test_expert_and_router_faults_ep2_by_expert_dp3(tmp_path: Path) -> None:
    _faults_case(6, tmp_path)


@pytest.mark.slow
def test_expert_and_router_faults_ep2_by_expert_dp4(tmp_path: Path) -> None:
    _faults_case(8, tmp_path)


def _clean_case(world: int, steps: int, tmp: Path) -> list[Any]:
    cfg = {
        "moe_catalog": _catalog(tmp),
        "recipes": ["router", "experts"],
        "expert_interval": 1,
        "router_interval": 1,
    }
    results = _run(world, [], steps, cfg)
    assert distinct_verdicts(results) == []
    return results


def test_clean_moe_gate_verifies_after_two_rotations(tmp_path: Path) -> None:
    """28 clean steps: no verdict; the gate's cycle is the catalog (2 routers + 14
    expert targets, every step checks one of each), so the first candidate is step 13
    (the first rotation closes) and it is verified only at step 27 (the second)."""
    results = _clean_case(6, 2 * EXPERT_TARGETS, tmp_path)
    for r in results:
        by_step = {s: (latest, cand, ver) for s, latest, cand, ver in r["gate"]}
        assert all(ver is None for s, (_, _, ver) in by_step.items() if s < 27), r["gate"]
        assert by_step[13][1] == 13 and by_step[12][1] is None
        assert by_step[27][1:] == (27, 13)


@pytest.mark.slow
def test_forty_clean_steps_ep2_by_expert_dp4(tmp_path: Path) -> None:
    _clean_case(8, 40, tmp_path)


@pytest.mark.slow
def test_heterogeneous_expert_fault_ep2_by_expert_dp4(tmp_path: Path) -> None:
    """Layers with 4, 2 and 8 experts of widths 32, 16, 24: one catalog per class, and a
    corrupted expert of the last layer (8 experts, 4 local) on rank 2 is named within
    one rotation of the experts track (layer 2's targets come last in it)."""
    cfg = {
        "moe_catalog": _catalog(tmp_path, "hetero"),
        "recipes": ["experts"],
        "expert_interval": 1,
    }
    results = run_hetero(8, cfg, tmp_path)
    assert results[2]["fired"] == [["expert_weight", 1]]
    catalog = [path for kind, path in results[0]["catalog"] if kind == "experts"]
    rotation = len(catalog)
    assert {p.split("@")[0] for p in catalog} == {f"layers.{i}.moe.experts" for i in range(3)}
    verdicts = distinct_verdicts(results)
    assert verdicts, "the fault was not found"
    assert all(v[1].startswith("experts/layers.2.moe.experts@") for v in verdicts), verdicts
    assert {(v[2], tuple(v[3])) for v in verdicts} == {("sdc", (2,))}
    assert min(v[0] for v in verdicts) - 1 <= rotation


def run_hetero(world: int, cfg: dict[str, Any], tmp: Path) -> list[Any]:
    """Corrupt local expert 3 of MoE layer 2 on rank 2 after step 1; train one full
    rotation past the fault."""
    faults = [{"rank": 2, "step": 1, "kind": "expert_weight", "layer": 2, "expert": 3}]
    return _run(world, faults, 2 + _hetero_rotation(tmp), cfg, "hetero")


def _hetero_rotation(tmp: Path) -> int:
    from scout_core.moe import CatalogSet

    catalogs = CatalogSet.load(tmp / "catalog.json")
    layers: dict[str, set[tuple[int, ...]]] = {}
    for c in catalogs.catalogs.values():
        for proj in c.workload.layers:
            layers.setdefault(proj.rsplit(".", 1)[0], set()).update(
                r.rows for r in c.representatives
            )
    return sum(len(rows) for rows in layers.values())
