"""Diagnostic process groups on real Gloo ranks: membership, isolation from WORLD and
from the training mesh's groups, and collectives that reach only the members."""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

# Paper Example A: DP4 x TP2, rank = 2d + t.
EXAMPLE_A_REPLICA = {0: (0, 2, 4, 6), 1: (1, 3, 5, 7)}


def _summed(pg: Any, rank: int) -> int:
    import torch
    import torch.distributed as dist

    value = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(value, group=pg)
    return int(value.item())


def example_a_body() -> dict[str, Any]:
    import torch.distributed as dist

    from scout_core.topology.groups import create_peer_groups
    from scout_core.topology.mesh import MeshLayout

    rank = dist.get_rank()
    layout = MeshLayout.from_order("tp-dp", tp=2, dp=4)
    groups = create_peer_groups(
        layout, rank, ("replica", "peer", "tp", "shard"), payload_backend="gloo"
    )
    world = dist.group.WORLD
    out: dict[str, Any] = {}
    for key, group in groups.items():
        out[key] = {
            "kind": group.kind,
            "ranks": list(group.ranks),
            "pg_ranks": dist.get_process_group_ranks(group.pg),
            "payload_ranks": dist.get_process_group_ranks(group.payload_pg),
            "backend": dist.get_backend(group.pg),
            "is_world": group.pg is world or group.payload_pg is world,
            "payload_is_pg": group.payload_pg is group.pg,
            "index": group.index_of(rank),
            "scope": None if group.scope is None else group.scope.value,
        }
    replica = groups["replica"]
    out["sum"] = _summed(replica.pg, rank)
    out["payload_sum"] = _summed(replica.payload_pg, rank)
    out["tp_sum"] = _summed(groups["tp"].pg, rank)
    out["peer_shares_replica_pg"] = groups["peer"].pg is replica.pg
    return out


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_example_a_groups_on_eight_ranks() -> None:
    results = run_ranks(example_a_body, 8, timeout_s=150)
    for rank, res in enumerate(results):
        members = EXAMPLE_A_REPLICA[rank % 2]
        replica = res["replica"]
        assert replica["kind"] == "replica"
        assert tuple(replica["ranks"]) == members
        assert tuple(replica["pg_ranks"]) == members
        assert tuple(replica["payload_ranks"]) == members
        assert replica["backend"] == "gloo"
        assert replica["index"] == members.index(rank)
        assert replica["scope"] == "rank"
        assert not replica["payload_is_pg"]
        assert res["peer"]["kind"] == "replica"
        assert res["peer"]["ranks"] == replica["ranks"]
        assert res["peer_shares_replica_pg"]
        tp_members = (rank - rank % 2, rank - rank % 2 + 1)
        assert tuple(res["tp"]["pg_ranks"]) == tp_members
        assert res["tp"]["kind"] == "t"
        assert res["tp"]["scope"] == "group"
        assert res["shard"]["ranks"] == [rank]  # s has degree 1
        assert res["shard"]["scope"] is None
        for key in ("replica", "peer", "tp", "shard"):
            assert not res[key]["is_world"]
        # all_reduce of rank+1 reaches exactly the replica members.
        assert res["sum"] == sum(m + 1 for m in members)
        assert res["payload_sum"] == res["sum"]
        assert res["tp_sum"] == sum(m + 1 for m in tp_members)


def device_mesh_body() -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scout_core.topology.groups import create_peer_groups
    from scout_core.topology.mesh import MeshLayout

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    layout = MeshLayout.from_device_mesh(mesh)
    groups = create_peer_groups(layout, rank, ("peer", "shard"))
    training_replicate = mesh.get_group("dp_replicate")
    training_shard = mesh.get_group("dp_shard")
    return {
        "mesh_replicate": dist.get_process_group_ranks(training_replicate),
        "mesh_shard": dist.get_process_group_ranks(training_shard),
        "replica": list(layout.replica_group(rank)),
        "shard": list(layout.shard_group(rank)),
        "peer_kind": groups["peer"].kind,
        "peer_pg_ranks": dist.get_process_group_ranks(groups["peer"].pg),
        "shard_pg_ranks": dist.get_process_group_ranks(groups["shard"].pg),
        "peer_is_training": groups["peer"].pg is training_replicate,
        "shard_is_training": groups["shard"].pg is training_shard,
        "sum": _summed(groups["peer"].pg, rank),
    }


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_layout_from_device_mesh_matches_its_groups() -> None:
    results = run_ranks(device_mesh_body, 4, timeout_s=100)
    for rank, res in enumerate(results):
        # HSDP 2x2: dp_replicate varies slowest, so replicas are {r, r +- 2}.
        assert res["mesh_replicate"] == res["replica"] == [rank % 2, rank % 2 + 2]
        assert res["mesh_shard"] == res["shard"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert res["peer_kind"] == "replica"
        assert res["peer_pg_ranks"] == res["replica"]
        assert res["shard_pg_ranks"] == res["shard"]
        assert not res["peer_is_training"]
        assert not res["shard_is_training"]
        assert res["sum"] == sum(m + 1 for m in res["replica"])


def refusal_body() -> list[str]:
    import torch.distributed as dist

    from scout_core.errors import ConfigError
    from scout_core.topology.groups import create_peer_groups
    from scout_core.topology.mesh import MeshLayout

    rank = dist.get_rank()
    fits = MeshLayout.from_order("dp", dp=3)
    cases = [
        (MeshLayout.from_order("tp-dp", tp=2, dp=2), ("replica",), "gloo"),
        (fits, ("rows",), "gloo"),
        (fits, ("replica",), "nccl"),
    ]
    messages = []
    for layout, kinds, backend in cases:
        try:
            create_peer_groups(layout, rank, kinds, backend=backend)
        except ConfigError as exc:
            messages.append(str(exc))
        else:
            messages.append("no error")
    # Refusals happen before any new_group, so the ranks are still in step.
    groups = create_peer_groups(fits, rank, ("peer",))
    messages.append(str(_summed(groups["peer"].pg, rank)))
    return messages


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_bad_setup_is_refused_before_any_group() -> None:
    results = run_ranks(refusal_body, 3, timeout_s=100)
    for messages in results:
        assert "(4 ranks) but the job has world size 3" in messages[0]
        assert "unknown group kind 'rows'" in messages[1]
        assert "must use a CPU backend" in messages[2]
        assert messages[3] == "6"  # 1 + 2 + 3
