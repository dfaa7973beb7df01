"""The plugin platform end to end on Gloo: several optimizers, agreement, CheckpointIO, the gate.

* Two optimizers stepped once per iteration (Megatron's chained optimizers) give one
  boundary per iteration, and the optimizer replay's slice rotates across both: a
  corrupted Adam moment of the *second* optimizer is named on ``optimizer/slice``.
* The agreement helpers refuse ``WORLD`` and a training group, and answer on SCOUT's.
* The shared ``check_checkpoint_io`` body passes against the core's DCP store.
* The core's ``FrameworkGate`` certifies checkpoints written through a
  ``CheckpointIO`` (here the DCP store), refuses a save after SDC and restores the
  verified one: the same driver the DeepSpeed plugin uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


def test_reduce_max_gathers_small_words_and_all_reduces_many() -> None:
    from platform_scenarios import reduce_max_gathers_small_and_all_reduces_large

    expected = [2, 0, 1 << 62, 7, -(1 << 63) + 2]  # ranks 0..2 of [r, -r, ±2**62, 7, min+r]
    for out in run_ranks(reduce_max_gathers_small_and_all_reduces_large, 3, timeout_s=90, env=ENV):
        assert out["small"] == expected
        assert out["small_calls"] == ["gather"]
        assert out["large"] == expected
        assert out["large_calls"] == ["all_reduce"]


@pytest.mark.timeout(200)
def test_two_optimizers_one_boundary_per_iteration_and_slices_across_both() -> None:
    from platform_scenarios import two_optimizers

    clean = run_ranks(two_optimizers, 3, args=(6, False), timeout_s=150, env=ENV)
    for out in clean:
        assert out["step"] == 6
        assert [b[0] for b in out["boundaries"]] == list(range(6))
        assert all(due == 1 for _, _, due in out["boundaries"])
        slices = out["slices"]
        assert slices == -(-sum(out["sizes"]) // 4096) and slices >= 2
        # one optimizer round per step, its slice rotating over both optimizers' parameters
        assert [idx for _, idx, _ in out["boundaries"]] == [[s % slices] for s in range(6)]
        assert out["verdicts"] == []
    bad = run_ranks(two_optimizers, 3, args=(6, True), timeout_s=150, env=ENV)
    verdicts = bad[0]["verdicts"]
    assert verdicts and all(v[2] == [1] for v in verdicts), verdicts
    assert {v[1] for v in verdicts} <= {"optimizer/slice", "optimizer/result"}
    assert min(v[0] for v in verdicts) >= 3


@pytest.mark.timeout(200)
def test_two_optimizers_training_is_bitwise_identical_with_scout_on() -> None:
    from platform_scenarios import two_optimizers_on_off

    for out in run_ranks(two_optimizers_on_off, 3, args=(6,), timeout_s=150, env=ENV):
        assert out["on"] == out["off"]


@pytest.mark.timeout(120)
def test_agreement_refuses_world_and_training_groups() -> None:
    from platform_scenarios import agreement_refuses_foreign_groups

    for out in run_ranks(agreement_refuses_foreign_groups, 3, timeout_s=90, env=ENV):
        assert "never WORLD" in out["world"]
        assert "never on a training group" in out["training"]
        assert out["min_max"] == [0, 20]
        assert out["all_ok"] == [True, False]
        assert out["any_flag"] == [False, True]
        assert out["same_value"] == [True, False]


@pytest.mark.timeout(200)
def test_checkpoint_io_conformance_on_the_dcp_store(tmp_path: Path) -> None:
    from platform_scenarios import dcp_io_conformance

    results = run_ranks(
        dcp_io_conformance, 2, args=(str(tmp_path / "ckpt"),), timeout_s=150, env=ENV
    )
    assert results[0]["tags"] == ["step-00000003", "step-00000007"]
    assert len({r["sig"] for r in results}) == 1  # DDP replicas restored to the same state


@pytest.mark.timeout(240)
def test_framework_gate_over_a_checkpoint_io(tmp_path: Path) -> None:
    from platform_scenarios import framework_gate_on_dcp

    ckpt = tmp_path / "ckpt"
    results = run_ranks(framework_gate_on_dcp, 4, args=(str(ckpt),), timeout_s=200, env=ENV)
    for out in results:
        assert out["saved"] == {"3": True, "7": True, "9": False}
        assert out["verdicts"] == [[9, "layer/layers.1/forward", [2]]]
        assert out["roles"] == {"step-00000003": "verified", "step-00000007": "suspect"}
        assert out["restored"] and out["step_after_load"] == 4
        assert out["recover_straggler"][:3] == ["step-00000003", 3, "latest"]
    assert (ckpt / "scout-certification.json").is_file()
