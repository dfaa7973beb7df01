"""The smallest plugin (``scout_toy``, for the toy framework ``toyframe``), written from
``docs/plugins.md`` alone, localizes an injected fault end to end.

Three ranks over Gloo train toyframe's engine (DDP around the core's tiny model) with
SCOUT switched on through the plugin and its section of the engine's config; rank 2's
output of ``layers.2`` is bit-flipped at step 2. Replay runs every step, so the three
replicas vote on layer 2 at step 2 and name rank 2. The plugin also passes the shared
conformance checks.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from scout_core.testing import BUSY_HOST, run_ranks

pytestmark = pytest.mark.distributed

WORLD = 3
STEPS = 4


def toy_rank(victim: int) -> dict[str, Any]:
    """One rank: build the engine, arm the fault, enable SCOUT through the plugin, train."""
    import torch
    import torch.distributed as dist
    import toyframe
    from scout_toy import plugin

    from scout_core.testing import BitFlip, Faults, TinyLM, batch, check_adapter, check_plugin

    rank = dist.get_rank()
    torch.manual_seed(0)
    section = {
        "report_dir": os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        "run_id": "toy",
        "replay_interval": 1,
        "recipes": ["hidden"],
        "observer": False,
        **BUSY_HOST,
    }
    engine = toyframe.Engine(TinyLM(), {"lr": 0.05, "scout": section})
    check_plugin(plugin, engine, registered=False)
    faults = Faults()
    faults.at(rank=victim, step=2).corrupt_output("layers.2", BitFlip(0))
    fired = faults.attach(engine.module, engine.optimizer)
    session = plugin.enable(engine)
    try:
        assert plugin.enable(engine) is session  # enabling twice returns the live session
        check_adapter(plugin.adapter_of(engine))
        for step in range(STEPS):
            engine.train_batch(batch(step, rank))
        verdicts = [
            (r.step, r.surface, r.failure.value if r.failure else None, list(r.outliers))
            for r in session.verdicts
        ]
    finally:
        session.close()
    return {"verdicts": verdicts, "fired": fired.fired(), "closed": plugin.session_of(engine)}


@pytest.mark.timeout(120)
def test_the_smallest_plugin_names_the_corrupted_rank() -> None:
    results = run_ranks(toy_rank, WORLD, args=(2,), timeout_s=90, env={"OMP_NUM_THREADS": "1"})
    expected = [[2, "layer/layers.2/forward", "sdc", [2]]]
    assert [r["verdicts"] for r in results] == [expected] * WORLD
    assert [r["fired"] for r in results] == [[], [], [["output", "layers.2", 2]]]
    assert all(r["closed"] is None for r in results)  # closing unregisters the session
