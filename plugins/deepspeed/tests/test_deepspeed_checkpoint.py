"""Checkpoint gating through ``engine.save_checkpoint`` / ``load_checkpoint`` (real DeepSpeed).

One ZeRO-2 job on 4 ranks (Gloo, CPU); the timeline is in ``ds_ckpt_scenarios``. The
gating itself is the core's ``FrameworkGate``; the plugin supplies the
``DeepSpeedCheckpointIO``, which also passes the core's shared conformance body.
Restores are compared with the signatures of every module parameter, fp32 master
partition and Adam slot taken right after the matching save, as JSON strings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


def _records(report: Path) -> list[dict[str, Any]]:
    (path,) = report.glob("*/rank-0.jsonl")  # <report_dir>/<run>/rank-0.jsonl
    lines = path.read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["schema"] == "scout.checkpoint/1"]


@pytest.mark.timeout(180)
def test_saves_are_certified_refused_after_sdc_and_restored_bitwise(tmp_path: Path) -> None:
    from ds_ckpt_scenarios import gated_checkpoints

    ckpt = tmp_path / "ckpt"
    results = run_ranks(gated_checkpoints, 4, args=(str(ckpt),), timeout_s=150, env=ENV)
    for out in results:
        assert out["saved"] == {"t3": True, "t7": True, "t8": True, "t9": False}
        assert not out["t9_exists"]
        assert out["roles_at_3"] == {"t3": "candidate"}
        assert out["roles_at_7"] == {"t3": "verified", "t7": "candidate"}
        assert out["straggler"][:3] == ["t7", 7, "latest"]
        assert out["after_straggler_equal_t7"]
        # The SDC on rank 2 is named at step 9 (layers.1 is replayed at steps 1, 5, 9).
        assert out["verdicts"] == [[9, "layer/layers.1/forward", "sdc", [2]]]
        assert out["roles_at_9"] == {"t3": "verified", "t7": "suspect", "t8": "suspect"}
        assert out["deepspeed_latest"] == "t8"
        assert not out["before_load_equal_t3"]  # the state moved on: the check can fail
        assert out["load_default"] == "t3" and out["load_default_equal_t3"]
        assert out["step_after_load"] == 4
        assert out["load_explicit"] == "t7" and out["load_explicit_equal_t7"]
        assert out["recover_sdc"][:3] == ["t3", 3, "verified"]
        assert out["recover_equal_t3"], out["mismatched"]
        assert out["patched"] and not out["patched_after_close"]
    assert results[2]["fired"] > 0
    assert len(results[0]["refs"]["t3"]) > 10  # params, masters and Adam slots compared

    recs = [
        (r["step"], r["action"], r["checkpoint_step"], r["selected"], r["detail"].get("tag"))
        for r in _records(Path(results[0]["report"]))
    ]
    assert recs == [
        (3, "capture", 3, None, "t3"),  # saved exactly at a cycle close
        (3, "candidate", 3, None, "t3"),
        (7, "promote", 3, None, "t3"),  # the next cycle closed clean
        (7, "capture", 7, None, "t7"),
        (7, "candidate", 7, None, "t7"),
        (7, "retrieve", 7, "latest", "t7"),  # recover(engine, "straggler")
        (8, "capture", 8, None, "t8"),
        (9, "retrieve", 3, "verified", "t3"),  # SDC found: the selection
        (9, "capture", 9, None, "t9"),  # the refused save
        (9, "retrieve", 3, "verified", "t3"),  # load_checkpoint(dir), no tag
        (3, "retrieve", 7, "latest", "t7"),  # load_checkpoint(dir, tag="t7")
        (7, "retrieve", 3, "verified", "t3"),  # recover(engine, "sdc")
    ]
    refused = [r for r in _records(Path(results[0]["report"])) if r["detail"].get("refused")]
    assert len(refused) == 1 and refused[0]["failure"] == "sdc"
    sidecar = json.loads((ckpt / "scout-certification.json").read_text(encoding="utf-8"))
    assert sidecar["schema"] == "scout.certification/1" and sidecar["K"] == 4


@pytest.mark.timeout(180)
def test_checkpoint_io_conformance(tmp_path: Path) -> None:
    """The core's shared CheckpointIO conformance body passes on DeepSpeed's IO."""
    from ds_ckpt_scenarios import io_conformance

    results = run_ranks(io_conformance, 2, args=(str(tmp_path / "ck"),), timeout_s=150, env=ENV)
    assert results[0]["tags"] == ["global_step4", "global_step8"]
    assert [r["writes"] for r in results] == [True, False]  # rank 0 writes DeepSpeed's latest
