"""``TitanCheckpointIO``: SCOUT's CheckpointIO shape over TorchTitan's own DCP checkpoints.

Processes A train two steps, save through the IO, then train on (TorchTitan's
``train()`` reloads the newest checkpoint first, then runs two more steps) and save
again; TorchTitan itself saves nothing (``--checkpoint.load_only``). Fresh
processes B build the same job, load the saved tag, and must hold the state A had
at the save, bitwise: model and optimizer, on both TP ranks, and the step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scout_torchtitan.testing import TitanAssets, titan_argv

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

RUNNER = "scout_torchtitan.testing.runner:run_trainer"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_save_train_on_and_restore_bitwise_in_fresh_processes(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    argv = titan_argv(
        titan_assets,
        steps=4,
        tp=2,
        dump_folder=str(tmp_path / "dump"),
        extra=["--checkpoint.enable", "--checkpoint.load_only"],
    )
    first = run_ranks(
        RUNNER,
        2,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:checkpoint_save_then_train_on"},
        timeout_s=120,
        init_process_group=False,
        env=titan_env,
    )
    a = [r["inspect"] for r in first]
    for out in a:
        assert out["tag"] == "step-2" and out["saved"] is True
        assert out["directory"] == str(tmp_path / "dump" / "checkpoint")
        assert out["step_at_save"] == 2 and out["step_after"] == 4
        assert out["after"] != out["at_save"]  # trained on
    assert [o["writes_metadata"] for o in a] == [True, False]
    assert a[0]["tags"] == ["step-2", "step-4"]  # complete ones, oldest first

    second = run_ranks(
        RUNNER,
        2,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:checkpoint_load_fresh"},
        timeout_s=120,
        init_process_group=False,
        env=titan_env,
    )
    for before, after in zip(a, (r["inspect"] for r in second), strict=True):
        assert after["tags"] == ["step-2", "step-4"]
        assert after["before"] != before["at_save"]  # a fresh model
        assert after["loaded"] is True and after["step"] == 2
        assert after["restored"] == before["at_save"]
        assert "no complete TorchTitan checkpoint 'step-99'" in after["step-99"]
        assert after["latest"] is True


@pytest.mark.timeout(200)
def test_titan_checkpoint_io_passes_the_shared_conformance_checks(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    argv = titan_argv(
        titan_assets,
        steps=12,  # the LR schedule spans 12 steps; advance() trains one at a time
        tp=2,
        dump_folder=str(tmp_path / "dump"),
        extra=["--checkpoint.enable", "--checkpoint.load_only"],
    )
    results = run_ranks(
        RUNNER,
        2,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:checkpoint_io_conformance"},
        timeout_s=150,
        init_process_group=False,
        env=titan_env,
    )
    out = [r["inspect"] for r in results]
    assert out[0]["tags"] == ["step-4", "step-8"]  # SCOUT steps 3 and 7; the broken save left none
    assert [o["writes"] for o in out] == [True, False]
