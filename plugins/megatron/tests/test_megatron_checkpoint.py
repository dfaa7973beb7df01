"""Megatron checkpoints (dist_checkpointing) save and restore model + optimizer bitwise."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


def _carrying(token: str) -> list[int]:
    """Pids of live processes whose environment holds ``token`` (inherited from a rank)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # gone, or another user's
    return found


@pytest.mark.timeout(300)
def test_save_train_on_then_load_in_fresh_processes(tmp_path: Path) -> None:
    from mg_ckpt_scenarios import load_run, save_run

    ckpt = str(tmp_path / "ckpt")
    token = f"scout-orphan-check-{uuid.uuid4().hex}"
    env = {**ENV, "SCOUT_MG_TOKEN": token}
    saved = run_ranks(save_run, 6, args=(ckpt,), timeout_s=170, env=env)  # DP3 x TP2
    # Megatron's writer leaves no process behind: no child of a rank after its saves,
    # and nothing started by the job is alive once the harness returned.
    assert all(out["children"] == [[], []] for out in saved), [o["children"] for o in saved]
    assert _carrying(token) == [] and os.getpid() not in _carrying(token)
    tags = ["iter_0000003", "iter_0000005"]
    for rank, out in enumerate(saved):
        assert out["saved"] == [True, True]
        assert list(out["tags"]) == tags and out["list"] == tags
        assert out["writes_metadata"] == (rank == 0)
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "5"
    assert (tmp_path / "ckpt" / "iter_0000003" / "metadata.json").is_file()

    loaded = run_ranks(load_run, 6, args=(ckpt,), timeout_s=170, env=ENV)
    for before, after in zip(saved, loaded, strict=True):
        assert after["list"] == tags and after["latest"] == "iter_0000005"
        assert after["fresh"] != before["tags"]["iter_0000003"]
        assert after["iter_3"] == 3
        assert after["after_load_3"] == before["tags"]["iter_0000003"]  # model + Adam state
        assert after["trained_to_5"] == before["tags"]["iter_0000005"]  # training resumes
        assert after["iter_latest"] == 5
        assert after["after_load_latest"] == before["tags"]["iter_0000005"]
        assert "not a complete Megatron checkpoint" in after["missing"]
        assert after["scratch_5"] == before["tags"]["iter_0000005"]  # reproducible across jobs
