"""Replay of a TorchTitan block under TP through the plugin's adapter (dp_replicate 3 x TP 2).

TorchTitan 0.3 (``partial_dtensor``) parallelises by replacing each module's
``forward`` with a redistributing closure and sharding parameters *and buffers*
into DTensors on the (dp_replicate, fsdp, tp) mesh, the ``fsdp`` dim of size one
even for DDP; sequence parallelism (on by default) hands each block a
sequence-sharded DTensor. Through :class:`~scout_torchtitan.adapter.TitanAdapter`
(the core's ``TorchAdapter`` plus TorchTitan's twin), a captured input becomes the
full tensor gathered on SCOUT's TP group, the parameters materialise full, the
RoPE buffer becomes plain, and the replayed call issues no collective at all,
matches the normal call to float rounding, and is bitwise equal on all six ranks
(what replica comparison needs).
"""

from __future__ import annotations

from typing import Any

import pytest
from scout_torchtitan.testing import TitanAssets, titan_argv

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed


def _replay(
    assets: TitanAssets, env: dict[str, str], dump: str, *extra: str
) -> list[dict[str, Any]]:
    argv = titan_argv(assets, steps=1, dp_replicate=3, tp=2, dump_folder=dump, extra=extra)
    results = run_ranks(
        "scout_torchtitan.testing.runner:run_trainer",
        6,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:tp_replay"},
        timeout_s=130,
        init_process_group=False,
        env=env,
    )
    return [r["inspect"] for r in results]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_tp_block_replays_locally_through_the_adapter(
    titan_assets: TitanAssets, titan_env: dict[str, str], titan_dump: str
) -> None:
    results = _replay(titan_assets, titan_env, titan_dump)
    for out in results:
        # Sequence parallel: the block's input is a sequence-sharded DTensor ...
        assert out["input"] == ["DTensor", ["Shard(dim=1)"]]
        # ... captured as the full sequence (gathered on SCOUT's TP group)
        assert out["captured"] == ["Tensor", [2, 32, 64]]
        assert out["normal_comms"] > 0  # the normal call talks on the training TP group
        assert out["params_plain"] and out["dtensor_buffers"] == ["attention.rope.cache"]
        assert out["replay_comms"] == 0
        assert out["replay_type"] == "Tensor"
        assert out["max_abs_diff"] < 1e-5
        assert out["live_still_parallel"]  # the live block was not touched
    assert len({out["replay_sha"] for out in results}) == 1


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_tp_replay_without_sequence_parallel(
    titan_assets: TitanAssets, titan_env: dict[str, str], titan_dump: str
) -> None:
    results = _replay(
        titan_assets, titan_env, titan_dump, "--parallelism.no-enable_sequence_parallel"
    )
    for out in results:
        assert out["input"] == ["DTensor", ["Replicate()"]]
        assert out["replay_comms"] == 0 and out["max_abs_diff"] < 1e-5
    assert len({out["replay_sha"] for out in results}) == 1
