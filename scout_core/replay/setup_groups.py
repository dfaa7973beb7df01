"""The diagnostic groups a replay driver runs on, made once at ``enable``.

Contract: :func:`make_groups` makes SCOUT's own peer, shard, TP, context and expert
groups for the adapter's layout and its job-wide Gloo group (never ``WORLD``, never a
training group), exchanges every rank's host name, and refuses deterministic CUDA
replay that cuBLAS could not honour on every rank together; :func:`setup_pools` makes
the timing pools and this rank's referee phase. Collective over the job.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from scout_core.config import Config
from scout_core.decision.agreement import all_gather_single, any_flag
from scout_core.errors import ConfigError
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.replay.pools import TimingPools
from scout_core.replay.referee import RefereeLink, RefereePhase
from scout_core.replay.schedule import Schedule
from scout_core.replay.scope import check_cublas_workspace
from scout_core.topology.groups import PeerGroup, create_peer_groups, diagnostic_group
from scout_core.topology.mesh import Axis, MeshLayout

__all__ = ["exchange_hosts", "make_groups", "setup_pools"]


def setup_pools(
    layout: MeshLayout, rank: int, schedule: Schedule, job: dist.ProcessGroup, config: Config
) -> tuple[TimingPools, RefereePhase]:
    """The timing pools (:mod:`.pools`) and this rank's referee phase; collective over the job."""
    timeout_s = config.referee_timeout_s
    pools = TimingPools.create(
        layout, rank, schedule, job, kappa=config.kappa, referee_timeout_s=timeout_s
    )
    links = {
        kind: RefereeLink(pool.referee_pg, timeout_s)
        for kind, pool in pools.pools.items()
        if pool.referee_pg is not None
    }
    return pools, RefereePhase(rank, layout.groups(layout.axes_for("peer")), links)


def make_groups(
    adapter: FrameworkAdapter, config: Config
) -> tuple[dict[str, PeerGroup], dict[int, str], dist.ProcessGroup]:
    """SCOUT's diagnostic groups for this layout, every rank's host and SCOUT's job-wide
    group. Collective; refuses (:class:`ConfigError`, on every rank together) deterministic
    CUDA replay that cuBLAS could not honour (:func:`.scope.check_cublas_workspace`)."""
    layout = adapter.layout()
    kinds = ["peer"]
    if layout.size(Axis.S) > 1 and layout.size(Axis.D) > 1:
        kinds.append("shard")
    if layout.size(Axis.T) > 1:
        kinds.append("t")  # TP shards are gathered on SCOUT's own TP group
    # Context/sequence and expert partners exchange activations inside a replayed
    # block (all-to-all on SCOUT's copies of their groups), so readiness must hold
    # across those groups too, or a ready group would wait on an unready partner.
    kinds.extend(k for k, axis in (("c", Axis.C), ("e", Axis.E)) if layout.size(axis) > 1)
    job = diagnostic_group(list(layout.ranks))
    hosts = exchange_hosts(layout, job)
    on_cuda = _on_cuda(adapter)
    refusal = check_cublas_workspace(uses_cuda=on_cuda, deterministic=config.deterministic)
    if any_flag(refusal is not None, job):  # every rank refuses together
        raise ConfigError(refusal or "another rank cannot run deterministic CUDA replay")
    payload = _payload_backend(on_cuda)
    groups = create_peer_groups(layout, adapter.rank(), kinds, payload_backend=payload)
    return groups, hosts, job


def _on_cuda(adapter: FrameworkAdapter) -> bool:
    """Whether the replayed modules' parameters live on a CUDA device."""
    for ref in adapter.repeated_layers():
        for p in ref.module.parameters():
            return p.device.type == "cuda"
    return False


def _payload_backend(on_cuda: bool) -> str | None:
    """NCCL payload groups when the job trains over NCCL on CUDA (one device per rank); else
    None: payloads go through host memory on Gloo (ranks sharing a GPU over Gloo, CPU jobs)."""
    if not (on_cuda and dist.is_nccl_available()):
        return None
    return "nccl" if "nccl" in str(dist.get_backend()).lower() else None


def exchange_hosts(layout: MeshLayout, group: dist.ProcessGroup | None = None) -> dict[int, str]:
    """Every rank's host name, exchanged as fixed-width bytes on a diagnostic group."""
    ranks = list(layout.ranks)
    group = diagnostic_group(ranks) if group is None else group
    name = socket.gethostname().encode()[:64]
    mine = torch.zeros(64, dtype=torch.uint8)
    mine[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    out = torch.empty(64 * len(ranks), dtype=torch.uint8)
    all_gather_single()(out, mine, group=group)
    rows = out.view(len(ranks), 64).tolist()
    return {
        r: bytes(b for b in row if b).decode(errors="replace")
        for r, row in zip(ranks, rows, strict=True)
    }
