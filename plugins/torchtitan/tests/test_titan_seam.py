"""The override seam and the framework facts, through a real TorchTitan ``Trainer``.

``--override.imports 'scout_torchtitan.overrides.scout={...}'`` must swap in SCOUT's
checkpoint manager, which must see the whole trainer; ``ScoutTrainer`` must do the
same from ``--scout.*`` flags. The plugin's fact functions (layout, modules,
optimizers, RNG) are checked against the live objects of a dp_replicate 3 x TP 2 job.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from scout_torchtitan.testing import TitanAssets, titan_argv

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

RUNNER = "scout_torchtitan.testing.runner:run_trainer"
OVERRIDE = "scout_torchtitan.overrides.scout"


def _override(**settings: Any) -> list[str]:
    return ["--override.imports", f"{OVERRIDE}={json.dumps(settings)}"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_override_through_torchtitan_main_sees_the_dp3_tp2_trainer(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Any
) -> None:
    argv = titan_argv(
        titan_assets,
        dump_folder=str(tmp_path / "dump"),
        steps=1,
        dp_replicate=3,
        tp=2,
        extra=_override(replay_interval=7, observer=False, report_dir=str(tmp_path / "r")),
    )
    results = run_ranks(
        "scout_torchtitan.testing.runner:launch_main",
        6,
        args=(argv,),
        timeout_s=130,
        init_process_group=False,
        env=titan_env,
    )
    for rank, built in enumerate(results):
        (seen,) = built
        assert seen["manager"] == "ScoutCheckpointManager"
        assert seen["trainer"] == "Trainer"
        assert (seen["rank"], seen["world_size"], seen["step"]) == (rank, 6, 0)
        assert seen["parallel_dims"]["spmd_backend"] == "partial_dtensor"
        assert seen["layout_sizes"] == {"d": 3, "s": 1, "t": 2, "p": 1, "c": 1, "e": 1}
        assert seen["dense_replicas"] == [rank % 2, rank % 2 + 2, rank % 2 + 4]
        assert seen["coordinates"]["tp"] == rank % 2
        assert seen["coordinates"]["dp_replicate"] == rank // 2
        assert seen["enabled"] and not seen["gated"]  # no --checkpoint.enable: nothing to gate
        assert seen["peers"] == seen["dense_replicas"]
        assert seen["layers"] == ["layers.0", "layers.1", "layers.2", "layers.3"]
        assert (seen["embedding"], seen["lm_head"]) == ("tok_embeddings", "lm_head")
        assert seen["optimizers"] == ["AdamW"]
        assert seen["scout"]["replay_interval"] == 7
        assert seen["scout"]["report_dir"] == str(tmp_path / "r")


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_facts_of_a_live_dp3_tp2_trainer(
    titan_assets: TitanAssets, titan_env: dict[str, str], titan_dump: str
) -> None:
    argv = titan_argv(titan_assets, steps=1, dp_replicate=3, tp=2, dump_folder=titan_dump)
    results = run_ranks(
        RUNNER,
        6,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:facts"},
        timeout_s=130,
        init_process_group=False,
        env=titan_env,
    )
    facts = [r["inspect"] for r in results]
    for rank, f in enumerate(facts):
        assert f["sizes"] == [3, 1, 2, 1, 1, 1]
        assert f["address"] == [rank // 2, 0, rank % 2, 0, 0, 0]
        assert f["replica_group"] == f["dense_replicas"] == [rank % 2, rank % 2 + 2, rank % 2 + 4]
        d = rank // 2
        assert f["coordinates"] == {"batch": d, "dp_replicate": d, "loss": d, "tp": rank % 2}
        assert f["outer"] == ["FSDPCheckpointWrapper"]
        assert f["block"] == ["Llama3TransformerBlock"]
        assert f["container_is_optimizer"] and f["per_part"] == [[0, "AdamW"]]
        assert f["checkpointer"] == "CheckpointManager" and f["seen"] is None
    # TorchTitan seeds every rank of the (PP-free) SPMD mesh alike.
    assert len({f["cpu_rng"] for f in facts}) == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_scout_trainer_flags_switch_the_same_manager_on(
    titan_assets: TitanAssets, titan_env: dict[str, str], titan_dump: str
) -> None:
    base = titan_argv(titan_assets, steps=1, config="tiny_llama3_scout", dump_folder=titan_dump)
    on = [
        *base,
        "--scout.enabled",
        "--scout.replay_interval",
        "9",
        "--scout.recipes",
        "hidden",
        "--scout.no-observer",
    ]
    (off_facts,) = run_ranks(
        RUNNER,
        1,
        args=(base,),
        kwargs={"train": False, "inspect": "titan_scenarios:facts"},
        timeout_s=100,
        init_process_group=False,
        env=titan_env,
    )
    (on_facts,) = run_ranks(
        RUNNER,
        1,
        args=(on,),
        kwargs={"train": False, "inspect": "titan_scenarios:facts"},
        timeout_s=100,
        init_process_group=False,
        env=titan_env,
    )
    assert off_facts["inspect"]["checkpointer"] == "CheckpointManager"
    seen = on_facts["inspect"]["seen"]
    assert seen["manager"] == "ScoutCheckpointManager" and seen["trainer"] == "ScoutTrainer"
    assert seen["scout"]["replay_interval"] == 9 and seen["scout"]["recipes"] == ["hidden"]
    assert seen["enabled"] and seen["peers"] == [0]  # one rank: a group of itself alone


@pytest.mark.timeout(300)
def test_training_with_and_without_the_override_is_bitwise_equal(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Any
) -> None:
    """dp_replicate 2 x TP 2, every recipe every step, observer and checkpoint gate on."""
    every = {k: 1 for k in ("replay_interval", "embedding_interval", "lm_head_interval")}
    settings = {**every, "optimizer_interval": 1, "report_dir": str(tmp_path / "report")}
    runs = []
    for name, extra in (("plain", []), ("scout", _override(**settings))):
        argv = titan_argv(
            titan_assets,
            steps=3,
            dp_replicate=2,
            tp=2,
            dump_folder=str(tmp_path / name),
            extra=[*extra, "--checkpoint.enable", "--checkpoint.interval", "2"],
        )
        runs.append(
            run_ranks(
                RUNNER,
                4,
                args=(argv,),
                kwargs={"inspect": "titan_scenarios:scout_state"},
                timeout_s=250,
                init_process_group=False,
                env=titan_env,
            )
        )
    plain, scout = runs
    assert [r["digest"] for r in plain] == [r["digest"] for r in scout]
    for r in scout:
        state = r["inspect"]
        assert state["enabled"] and state["seen"]["gated"] and state["step"] == 3
        # every recipe ran, on ready peers, and nothing disagreed
        assert len(state["rounds"]) == 12 and all(o["ready"] for o in state["rounds"])
        assert state["verdicts"] == []
    assert not plain[0]["inspect"]["enabled"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_hook_the_container_for_steps_the_inner_optimizers_misfire(
    titan_assets: TitanAssets, titan_env: dict[str, str], titan_dump: str
) -> None:
    argv = titan_argv(titan_assets, steps=3, dump_folder=titan_dump)
    (result,) = run_ranks(
        RUNNER,
        1,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:optimizer_hooks"},
        timeout_s=100,
        init_process_group=False,
        env=titan_env,
    )
    hooks = result["inspect"]
    # A checkpoint-style state_dict() on a fresh optimizer runs a zero-lr inner step.
    assert hooks["after_state_dict"] == {"container": 0, "inner": 1}
    assert hooks["after_train"] == {"container": 3, "inner": 4}
    assert hooks["step"] == 3
