"""Replaying a TP=2 TransformerLayer never issues a collective on Megatron's groups."""

from __future__ import annotations

import pytest

from scout_core.testing import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # CI's set: docs/megatron.md, Tests

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(180)
def test_tp_layer_replays_on_scout_group_bitwise() -> None:
    from mg_regroup_scenarios import replay_tp_layer

    results = run_ranks(replay_tp_layer, 4, timeout_s=170, env=ENV)  # DP2 x TP2
    for out in results:
        # The normal call talks on Megatron's TP group (forward and backward all-reduces)...
        assert set(out["normal_traffic"]) == {"tp"} and out["normal_traffic"]["tp"] >= 2
        # ...the replayed call issues the same collectives on SCOUT's group, none on any
        # Megatron group (all of ProcessGroupCollection, the DP Gloo group and WORLD).
        assert out["replay_traffic"] == {"scout_tp": out["normal_traffic"]["tp"]}
        assert out["outputs_equal"] and out["grads_equal"] and out["n_grads"] > 10
        assert out["inside"] and out["shared_copy"]
        assert out["restored"] and out["restored_after_error"]
        assert out["forbidden_traffic"] == {}
        assert "Forbidden(ranks=" in out["forbidden"]
        assert "SCOUT has no substitute" in out["forbidden"]
        # Groups held by the layer: tp_group attributes and pg_collection fields; those
        # with the TP ranks are substituted, the others (DP, TP x DP ...) forbidden.
        sites = {attr: sub for attr, sub in out["sites"]}
        assert sites["tp_group"] and sites["pg_collection.tp"]
        assert sites["pg_collection.dp"] is False
    assert [out["tp_ranks"] for out in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
