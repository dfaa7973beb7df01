"""SCOUT on a real megatron-core GPTModel, DP3 x TP2 on CPU (Gloo), observer on.

One 10-step job carries two faults in different replica groups (global rank =
t + 2d, replica groups {0, 2, 4} and {1, 3, 5}; two layers, replayed alternately):

* rank 4 flips the lowest mantissa bit of ``decoder.layers.1``'s output from step 3
  on (a persistent compute SDC) -> ``sdc`` naming rank 4 on the layer's ``forward``
  whenever layer 1 is replayed (steps 3, 5, 7, 9), never its TP partner 5;
* rank 3 sleeps 200 ms in each layer at steps 4-7 (a compute straggler) ->
  ``straggler`` naming rank 3 once two consecutive rounds confirm it, never its TP
  partner 2 (replay runs TP layers decoupled from their partners).

The Bridge variant runs the same job through the real Bridge ``CallbackManager``
(loaded from the installed 0.3.1 file) with ``callbacks_from`` and full activation
recompute, and must give the same verdicts.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing import ran_every_due_round, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
LAYERS = ["decoder.layers.0", "decoder.layers.1"]
FAULTS: list[dict[str, Any]] = [
    {"kind": "sdc", "rank": 4, "start": 3, "targets": ["decoder.layers.1"]},
    {"kind": "straggler", "rank": 3, "start": 4, "stop": 8, "seconds": 0.2, "targets": LAYERS},
]
STEPS = 10


def _check_fault_run(results: list[dict[str, Any]]) -> None:
    by_rank = {r["rank"]: r for r in results}
    assert by_rank[4]["fired"] > 0 and by_rank[3]["fired"] > 0
    for r in results:
        assert r["unready"] == 0  # every round compared something: captures were complete
    group0 = [by_rank[r]["verdicts"] for r in (0, 2, 4)]
    group1 = [by_rank[r]["verdicts"] for r in (1, 3, 5)]
    assert group0[0] == group0[1] == group0[2] and group1[0] == group1[1] == group1[2]
    sdc = {(v[0], v[1]) for v in group0[0]}
    assert {step for step, _ in sdc} == {3, 5, 7, 9}
    # The flip lands on the layer's output after it is computed: the replay's gradients
    # (taken from the source's output gradient) agree, only the output differs.
    assert {surface for _, surface in sdc} == {"layer/decoder.layers.1/forward"}
    for v in group0[0]:
        assert v[2:] == ["sdc", "attributed", [4], "rank", [0, 2, 4]], v
    slow = group1[0]
    assert slow, "the straggler was not named"
    assert {v[0] for v in slow} <= {5, 6, 7}  # confirmed from the second slow round on
    for v in slow:
        assert v[1].endswith("/t_M")
        assert v[2:] == ["straggler", "attributed", [3], "rank", [1, 3, 5]]


@pytest.mark.timeout(420)
def test_bridge_callbacks_localize_sdc_and_straggler_under_recompute() -> None:
    from mg_scout_scenarios import train

    over = {"observer": True, "spec": {"recompute": True}}
    results = run_ranks(train, 6, args=(FAULTS, STEPS, over, "bridge"), timeout_s=400, env=ENV)
    _check_fault_run(results)
    for r in results:
        attached_at, final_step, closed = r["attached"]
        assert (attached_at, final_step, closed) == (0, STEPS, True)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_attach_localizes_sdc_and_straggler() -> None:
    from mg_scout_scenarios import train

    results = run_ranks(train, 6, args=(FAULTS, STEPS, {"observer": True}), timeout_s=400, env=ENV)
    _check_fault_run(results)
    assert all(r["attached"] == [STEPS] for r in results)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_thirty_clean_steps_are_silent_and_bitwise_identical_to_scout_off() -> None:
    from mg_scout_scenarios import clean_and_bitwise

    results = run_ranks(clean_and_bitwise, 6, args=(30, {"observer": True}), timeout_s=400, env=ENV)
    for r in results:
        assert r["observer"]
        assert r["verdicts"] == []  # no record naming a rank, none inconclusive
        assert ran_every_due_round(r, 30)
        assert r["recipes"] == [
            "layer/decoder.layers.0",
            "layer/decoder.layers.1",
            "layer/embedding",
            "layer/output_layer",
            "optimizer",
        ]
        assert r["on"] == r["off"]  # parameters, Adam state, losses and the CPU RNG, bitwise
