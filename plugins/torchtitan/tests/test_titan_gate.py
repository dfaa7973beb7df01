"""SCOUT's checkpoint gate over TorchTitan's own checkpoints (dp_replicate 3 x TP 2).

Processes A train 12 steps with ``--checkpoint.enable --checkpoint.interval 1``:
every TorchTitan save goes through the gate. The catalog (4 layers, embedding, LM
head, optimizer) closes a clean cycle every 4 steps, so ``step-4`` (saved at the
first close) is a candidate, and verified once the second cycle closes clean.
Rank 2 then computes wrongly from step 9: replay names it, everything saved after
``step-4`` becomes suspect and later saves are refused. ``scout_torchtitan.recover``
restores ``step-4`` in place; fresh processes B, whose TorchTitan load at the start
of training goes through the gate, restore the same step, bitwise (model and
optimizer on every rank).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scout_torchtitan.testing import TitanAssets, titan_argv

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

SDC_STEP = 9


def _argv(assets: TitanAssets, tmp: Path) -> list[str]:
    every = {k: 1 for k in ("replay_interval", "embedding_interval", "lm_head_interval")}
    settings = {**every, "optimizer_interval": 1, "report_dir": str(tmp / "report")}
    return titan_argv(
        assets,
        steps=12,
        dp_replicate=3,
        tp=2,
        dump_folder=str(tmp / "dump"),
        extra=[
            "--override.imports",
            f"scout_torchtitan.overrides.scout={json.dumps(settings)}",
            "--checkpoint.enable",
            "--checkpoint.interval",
            "1",
            "--checkpoint.keep_latest_k",
            "0",
        ],
    )


def _ranks(argv: list[str], inspect: str, env: dict[str, str]) -> list[dict[str, Any]]:
    results = run_ranks(
        "scout_torchtitan.testing.runner:run_trainer",
        6,
        args=(argv,),
        kwargs={"train": False, "inspect": f"titan_scenarios:{inspect}"},
        timeout_s=400,
        init_process_group=False,
        env=env,
    )
    return [r["inspect"] for r in results]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sdc_after_two_clean_cycles_recovers_a_verified_step_bitwise(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    argv = _argv(titan_assets, tmp_path)
    a = _ranks(argv, "gate_sdc_then_recover", {**titan_env, "SCOUT_TITAN_SDC_STEP": str(SDC_STEP)})
    roles = a[0]["roles"]
    assert roles["step-4"] == "verified"  # candidate at the first close, verified at the second
    assert roles["step-8"] == "suspect"  # candidate of the cycle the SDC fell into
    assert all(roles[f"step-{n}"] == "suspect" for n in range(5, SDC_STEP + 1)), roles
    assert not any(f"step-{n}" in roles for n in range(SDC_STEP + 2, 13)), roles  # refused
    sdc = [v for r in a for v in r["verdicts"] if v["failure"] == "sdc"]
    assert sdc and min(v["step"] for v in sdc) == SDC_STEP
    assert all(v["outliers"] == [2] for v in sdc)
    for out in a:
        assert out["recovered"][:3] == ["step-4", 3, "verified"]
        assert out["step_after_recover"] == 4 and out["scout_step"] == 4
        assert out["digest_after_recover"] == out["digests"]["4"]
    # fresh processes: TorchTitan's own load at the start of training, through the gate
    b = _ranks(argv, "gate_load_fresh", titan_env)
    for before, after in zip(a, b, strict=True):
        assert after["before"] != before["digests"]["4"]  # a freshly initialised model
        assert after["loaded"] is True and after["step"] == 4 and after["scout_step"] == 4
        assert after["digest"] == before["digests"]["4"]
