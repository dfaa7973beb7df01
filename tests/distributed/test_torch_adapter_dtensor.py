"""TorchAdapter rebuilds DTensors on SCOUT's groups: parameters on meshes with size-1
dims, sequence-sharded activations, partial values, DTensor buffers in ``call``."""

from __future__ import annotations

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(120)
def test_dtensors_are_rebuilt_full_on_scouts_groups() -> None:
    for out in run_ranks("dtensor_scenarios:dtensor_rebuild", 2, timeout_s=100):
        assert out["capture_copy_set"]
        assert out["weight_full"] and out["weight_plain"] == "Tensor"  # size-1 dim skipped
        assert out["activation"] == ["Tensor", True]  # Shard(1) gathered in tp order
        assert out["partial"] == [3.0, 3.0, 3.0]  # 1 + 2, reduced on SCOUT's TP group
        assert out["plain_copied"]
        assert out["call"] == ["Tensor", True]  # the DTensor buffer became full


@pytest.mark.timeout(120)
def test_a_mesh_dim_without_a_scout_group_is_refused() -> None:
    for out in run_ranks("dtensor_scenarios:dtensor_refused", 2, timeout_s=100):
        assert out["tp_ok"]
        assert "'cp'" in out["cp"] and "not replayed" in out["cp"]


@pytest.mark.timeout(120)
def test_an_injected_output_fault_corrupts_only_the_local_shard() -> None:
    healthy, faulty = run_ranks("dtensor_scenarios:corrupt_dtensor_output", 2, timeout_s=100)
    assert not healthy["changed"] and healthy["fired"] == []
    assert faulty["changed"] and faulty["fired"] == [["output", "0", 0]]
