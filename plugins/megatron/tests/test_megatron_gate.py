"""Megatron checkpoints through SCOUT's checkpoint gate, and the shared conformance bodies.

The timeline of the gate test is in ``mg_gate_scenarios``: two clean recipe cycles
certify a checkpoint, an SDC then makes the newer ones suspect and refuses the next
save, and a fresh job (new processes, other weights) recovers the certified step
bitwise through the Megatron CheckpointIO (``dist_checkpointing``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scout_core.testing import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # CI's set: docs/megatron.md, Tests

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(600)
def test_sdc_after_two_clean_cycles_then_recover_in_fresh_processes(tmp_path: Path) -> None:
    from mg_gate_scenarios import certify_then_sdc, recover_fresh

    ckpt = str(tmp_path / "ckpt")
    first = run_ranks(certify_then_sdc, 6, args=(ckpt,), timeout_s=280, env=ENV)
    for out in first:
        assert out["saved"] == {
            "iter_0000002": True,
            "iter_0000004": True,
            "iter_0000005": True,
            "iter_0000006": False,
        }
        assert out["roles"]["1"] == {"iter_0000002": "candidate"}
        assert out["roles"]["3"] == {"iter_0000002": "verified", "iter_0000004": "candidate"}
        assert out["roles"]["5"] == {
            "iter_0000002": "verified",
            "iter_0000004": "suspect",
            "iter_0000005": "suspect",
        }
        assert out["listed"] == ["iter_0000002", "iter_0000004", "iter_0000005"]
        assert not out["iter_6_exists"]
    for rank in (0, 2, 4):
        assert first[rank]["verdicts"] and all(
            v[0] == 5 and v[2:5] == ["sdc", "attributed", [4]] for v in first[rank]["verdicts"]
        )
    sidecar = json.loads((tmp_path / "ckpt" / "scout-certification.json").read_text())
    assert sidecar["K"] == 2

    second = run_ranks(recover_fresh, 6, args=(ckpt,), timeout_s=280, env=ENV)
    for before, after in zip(first, second, strict=True):
        assert after["fresh"] != before["digests"]["iter_0000002"]
        assert after["recovered"][:3] == ["iter_0000002", 1, "verified"]
        assert after["recovered_digest"] == before["digests"]["iter_0000002"]  # bitwise
        assert after["step_after"] == 2  # the step clock restarts after the restored step
        assert after["trained_digest"] == before["digests"]["iter_0000004"]
        assert after["loaded_default"] == 2 and after["loaded_digest"] == after["recovered_digest"]


@pytest.mark.timeout(400)
def test_plugin_adapter_and_checkpoint_io_conformance(tmp_path: Path) -> None:
    from mg_gate_scenarios import conformance

    results = run_ranks(conformance, 4, args=(str(tmp_path / "ck"),), timeout_s=380, env=ENV)
    assert [r["writes"] for r in results] == [True, False, False, False]  # the tracker's rank
    for rank, out in enumerate(results):
        assert out["tags"] == ["iter_0000004", "iter_0000008"]
        # ScoutCallback.on_checkpoint_save put Bridge's checkpoint of iteration 4 (one step,
        # then the three the conformance body trained) into the gate's ledger: saved when
        # the second recipe cycle (K = 2) closed clean at step 3, so a candidate
        assert out["recorded"] == {"iter_0000004": "candidate"}
        assert out["layers"] == ["decoder.layers.0", "decoder.layers.1"]
        assert out["special"] == ["embedding", "lm_head"]
        assert out["ownership"] == "replicated"  # FP32Optimizer: full replicated state
        assert out["streams"] == [
            "cpu",
            "megatron:data-parallel-rng",
            "megatron:expert-parallel-rng",
            "megatron:model-parallel-rng",
        ]
        assert {"tp", "dp", "dp_cp", "pp"} <= set(out["groups"])
        assert out["address"] == [rank // 2, 0, rank % 2, 0, 0, 0]  # (d, s, t, p, c, e)
        tp = [rank - rank % 2, rank - rank % 2 + 1]
        # A layer's TP groups go to a SCOUT group of this rank alone; the embedding's
        # to SCOUT's TP group; everything else is forbidden.
        for name, (ranks, what) in out["replay_groups"].items():
            assert what == (f"scout[{rank}]" if ranks == tp else "forbidden"), name
        assert out["replay_groups"]["self_attention.linear_proj:tp_group"] == [tp, f"scout[{rank}]"]
        emb = out["embedding_groups"]["word_embeddings:tp_group"]
        assert emb == [tp, f"scout{tp}"]


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_bridge_manager_seam_refuses_a_save_after_sdc_and_loads_the_newest_verified(
    tmp_path: Path,
) -> None:
    """Bridge's saves and loads through ``ScoutCheckpointManager`` (the
    ``custom_manager_class`` seam of Bridge 0.4 on), over a stand-in of Bridge's default
    manager: the save of iteration 6, while the SDC of step 5 awaits recovery, writes
    nothing; a new job's load restores iteration 2, the newest verified tag, bitwise."""
    from mg_gate_scenarios import bridge_certify_then_sdc, bridge_load_fresh

    ckpt = str(tmp_path / "ckpt")
    first = run_ranks(bridge_certify_then_sdc, 6, args=(ckpt,), timeout_s=280, env=ENV)
    for out in first:
        assert out["saved"] == [2, 4, 5, 6]
        assert out["roles"]["5"] == {
            "iter_0000002": "verified",
            "iter_0000004": "suspect",
            "iter_0000005": "suspect",
        }
        assert not out["iter_6_exists"]
    assert first[4]["verdicts"] and first[4]["verdicts"][0][2:5] == ["sdc", "attributed", [4]]
    second = run_ranks(bridge_load_fresh, 6, args=(ckpt,), timeout_s=280, env=ENV)
    for before, after in zip(first, second, strict=True):
        assert after["fresh"] != before["digests"]["iter_0000002"]
        assert after["loaded"] == [2, 0]
        assert after["loaded_digest"] == before["digests"]["iter_0000002"]
        assert after["step_after"] == 2
