"""Peer replication of in-memory gate checkpoints: a ring of sends on a diagnostic group.

With replication on, each rank sends its flattened snapshot to the next rank of a
diagnostic Gloo ring and keeps the one it receives, so a lost machine can get its shard
back from its peer (:func:`fetch_from_peer`). The wire is three tensors (sizes, a JSON
skeleton as bytes, the tensors' bytes back to back): nothing is pickled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.skeleton import flatten, unflatten
from scout_core.checkpoint.validate import check_int, skeleton_specs, specs_nbytes
from scout_core.errors import CheckpointError

if TYPE_CHECKING:
    from scout_core.checkpoint.memory import Snapshot

__all__ = ["PeerReplica", "fetch_from_peer", "replicate_to_peer"]


@dataclass(frozen=True)
class PeerReplica:
    """A peer's generation held on this rank."""

    owner: int
    """Global rank whose state this is."""
    step: int
    tree: dict[str, Any]


def _ring(group: dist.ProcessGroup, ranks: Sequence[int]) -> tuple[int, int, int]:
    if group is None or group == dist.group.WORLD:
        raise ValueError("peer replication runs on a diagnostic group, never WORLD")
    me = dist.get_rank()
    if me not in ranks or len(ranks) < 2:
        raise ValueError(f"rank {me} needs a peer group of >= 2 ranks containing it, got {ranks}")
    i = list(ranks).index(me)
    return me, ranks[(i + 1) % len(ranks)], ranks[(i - 1) % len(ranks)]


def _encode(step: int, owner: int, tree: Mapping[str, Any] | None) -> tuple[bytes, torch.Tensor]:
    if tree is None:
        return b"", torch.empty(0, dtype=torch.uint8)
    skeleton, tensors = flatten(tree)
    keys = list(tensors)
    header = json.dumps({"step": step, "owner": owner, "keys": keys, "skeleton": skeleton})
    parts = [tensors[k].detach().contiguous().reshape(-1).view(torch.uint8) for k in keys]
    payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
    return header.encode(), payload


def _decode(header: bytes, payload: torch.Tensor) -> PeerReplica:
    try:
        meta = json.loads(header)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"peer replica header is malformed: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("keys"), list):
        raise CheckpointError("peer replica header is malformed")
    specs = skeleton_specs(meta.get("skeleton"))
    if specs_nbytes(specs) != payload.numel() or set(meta["keys"]) != set(specs):
        raise CheckpointError("peer replica header does not describe its payload")
    tensors: dict[str, torch.Tensor] = {}
    offset = 0
    for key in meta["keys"]:
        dtype, shape = specs[key]
        count = 1
        for n in shape:
            count *= n
        nbytes = count * torch.empty(0, dtype=dtype).element_size()
        raw = payload[offset : offset + nbytes].clone()
        offset += nbytes
        tensors[key] = raw.view(dtype).reshape(shape)
    if offset != payload.numel():
        raise CheckpointError(f"peer replica has {payload.numel() - offset} stray bytes")
    return PeerReplica(
        owner=check_int(meta.get("owner"), "peer replica owner"),
        step=check_int(meta.get("step"), "peer replica step", low=-1),
        tree=unflatten(meta["skeleton"], tensors),
    )


def _p2p(
    out: torch.Tensor, into: torch.Tensor, send_to: int, recv_from: int, group: dist.ProcessGroup
) -> None:
    """Send ``out`` to one peer while receiving ``into`` from another (empty: skipped)."""
    reqs = []
    if out.numel():
        reqs.append(dist.isend(out, send_to, group=group))
    if into.numel():
        reqs.append(dist.irecv(into, recv_from, group=group))
    for r in reqs:
        if r is not None:  # None only for a rank outside the group, which _ring rules out
            r.wait()


def _swap(
    header: bytes, payload: torch.Tensor, *, send_to: int, recv_from: int, group: dist.ProcessGroup
) -> tuple[bytes, torch.Tensor]:
    """Send (header, payload) to one peer while receiving the same from another."""
    got = torch.empty(2, dtype=torch.int64)
    sizes = torch.tensor([len(header), payload.numel()], dtype=torch.int64)
    _p2p(sizes, got, send_to, recv_from, group)
    head_out = (
        torch.frombuffer(bytearray(header), dtype=torch.uint8)
        if header
        else torch.empty(0, dtype=torch.uint8)
    )
    head_in = torch.empty(int(got[0]), dtype=torch.uint8)
    _p2p(head_out, head_in, send_to, recv_from, group)
    body_in = torch.empty(int(got[1]), dtype=torch.uint8)
    _p2p(payload, body_in, send_to, recv_from, group)
    return bytes(head_in.tolist()), body_in


def replicate_to_peer(
    snap: Snapshot, *, group: dist.ProcessGroup, ranks: Sequence[int]
) -> PeerReplica:
    """Ring replication over ``group`` (a diagnostic Gloo group of ``ranks``): send ``snap``
    to the next rank and return the previous one's."""
    me, nxt, prev = _ring(group, ranks)
    snap.wait()
    header, payload = _encode(snap.step, me, snap.tree)
    head_in, body_in = _swap(header, payload, send_to=nxt, recv_from=prev, group=group)
    replica = _decode(head_in, body_in)
    if replica.owner != prev:
        raise CheckpointError(f"replica from rank {prev} claims owner {replica.owner}")
    return replica


def fetch_from_peer(
    held: PeerReplica | None, *, group: dist.ProcessGroup, ranks: Sequence[int]
) -> PeerReplica | None:
    """Reverse ring, collective: return ``held`` to its owner and receive this rank's own
    replica, or None when the next rank holds none (a rank holding nothing sends nothing)."""
    me, nxt, prev = _ring(group, ranks)
    if held is not None and held.owner != prev:
        raise CheckpointError(f"rank {me} holds a replica of rank {held.owner}, expected {prev}")
    tree = None if held is None else held.tree
    header, payload = _encode(-1 if held is None else held.step, prev, tree)
    head_in, body_in = _swap(header, payload, send_to=prev, recv_from=nxt, group=group)
    if not head_in:
        return None
    mine = _decode(head_in, body_in)
    if mine.owner != me:
        raise CheckpointError(f"rank {nxt} returned a replica of rank {mine.owner}, not {me}")
    return mine
