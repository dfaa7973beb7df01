"""In-memory gate checkpoints in the spirit of GEMINI: capture, three generations, replicas.

At every accepted replay boundary the gate captures the post-optimizer training
state (model, optimizer, RNG streams, caller state; :mod:`.state`) into host
memory, so recovery from a trusted generation costs a memory copy, not a read from
storage. :class:`InMemoryCheckpoints` keeps the three generations the gate names
(``latest``, ``candidate``, ``verified``); a generation that is both latest and
candidate is one object, so at most three host copies exist.

[Capture without blocking training]
On CUDA each tensor is copied to pinned host memory with ``non_blocking=True`` on a
side stream that first waits for the training stream, so the copy sees the updated
parameters while the host returns at once. The copy must finish before the next
optimizer step writes those tensors, so an optimizer step pre-hook makes the
training stream *wait on the copy's event* (a device-side wait; the host still
does not block). :meth:`Snapshot.wait` blocks only when someone reads the copy
(restore, persist, replicate). On CPU the copy is a plain clone.

[Peer replication]
With replication on, each rank sends its flattened snapshot to the next rank of a
diagnostic Gloo group (a ring) and keeps the one it receives, so a machine that is
lost can get its shard back from its peer (:func:`fetch_from_peer`). The wire is
three tensors (sizes, a JSON skeleton as bytes, the tensors' bytes back to back):
no objects are pickled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from scout_core.checkpoint.state import capture_tree, flatten, restore_tree, unflatten
from scout_core.checkpoint.validate import check_int, skeleton_specs, specs_nbytes
from scout_core.decision.gate import Selection
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import RngStream

__all__ = ["Snapshot", "InMemoryCheckpoints", "PeerReplica", "replicate_to_peer", "fetch_from_peer"]


@dataclass
class Snapshot:
    """One captured generation: the step it belongs to and its host-memory tree."""

    step: int
    tree: dict[str, Any]
    blocking_s: float = 0.0
    """Host time the capture call blocked for (monotonic clock)."""
    _event: Any = field(default=None, repr=False)

    def wait(self) -> None:
        """Block until the asynchronous device-to-host copy has finished."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None

    @property
    def ready(self) -> bool:
        """Whether the copy has finished (always true on CPU)."""
        return self._event is None or bool(self._event.query())

    def nbytes(self) -> int:
        """Host bytes held by the snapshot's tensors."""
        _, tensors = flatten(self.tree)
        return sum(t.numel() * t.element_size() for t in tensors.values())


class _HostCopier:
    """Copies tensors to host memory: async on a side stream for CUDA, clone on CPU."""

    def __init__(self) -> None:
        self._stream: Any = None
        self._used = False

    def begin(self) -> None:
        self._used = False

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cuda":
            return t.detach().clone()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=t.device)  # type: ignore[no-untyped-call]  # torch.cuda.Stream is unannotated
        if not self._used:
            # The copy must see the optimizer's writes, which are queued on the
            # training stream.
            self._stream.wait_stream(torch.cuda.current_stream(t.device))
            self._used = True
        host = torch.empty(t.size(), dtype=t.dtype, device="cpu", pin_memory=True)
        with torch.cuda.stream(self._stream):
            host.copy_(t, non_blocking=True)
        t.record_stream(self._stream)  # keep t's memory alive until the copy ran
        return host

    def finish(self) -> Any:
        """The event marking the end of this capture's copies, or ``None``."""
        if not self._used:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch.cuda.Event is unannotated
        event.record(self._stream)
        return event


class InMemoryCheckpoints:
    """The gate's latest / candidate / verified generations for one rank, in host memory."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        rng_streams: Sequence[RngStream],
    ) -> None:
        self.model = model
        self.optimizers = tuple(optimizers)
        self.rng_streams = tuple(rng_streams)
        self.latest: Snapshot | None = None
        self.candidate: Snapshot | None = None
        self.verified: Snapshot | None = None
        self.replica: PeerReplica | None = None
        """The peer's candidate this rank holds, when replication is on."""
        self._copier = _HostCopier()
        self._hooks: list[RemovableHandle] = [
            opt.register_step_pre_hook(self._before_step) for opt in self.optimizers
        ]

    def _before_step(self, *_: Any) -> None:
        # Device-side wait: the step's kernels start after the copy; the host runs on.
        snap = self.latest
        if snap is not None and snap._event is not None and torch.cuda.is_available():
            torch.cuda.current_stream().wait_event(snap._event)

    def close(self) -> None:
        """Remove the optimizer hooks (idempotent)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def capture(self, step: int, extra: Mapping[str, Any] | None = None) -> Snapshot:
        """Copy the live state into host memory as the new ``latest`` generation."""
        start = time.monotonic()
        self._copier.begin()
        tree = capture_tree(self.model, self.optimizers, self.rng_streams, extra, self._copier)
        event = self._copier.finish()
        snap = Snapshot(step=step, tree=tree, _event=event)
        snap.blocking_s = time.monotonic() - start
        self.latest = snap
        return snap

    def rotate(self) -> None:
        """Cycle boundary: verified ← candidate (when one exists), candidate ← latest."""
        if self.latest is None:
            raise CheckpointError("cycle boundary without a latest in-memory checkpoint")
        if self.candidate is not None:
            self.verified = self.candidate
        self.candidate = self.latest

    def drop_candidate(self) -> Snapshot | None:
        """Forget the candidate (it can no longer be promoted); return it."""
        dropped, self.candidate = self.candidate, None
        return dropped

    def get(self, selection: Selection) -> Snapshot | None:
        """The generation a retrieval selected, or ``None`` when memory lacks it."""
        return self.latest if Selection(selection) is Selection.LATEST else self.verified

    def restore(
        self, snap: Snapshot, extra: MutableMapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write ``snap`` back into the live model, optimizers, RNG and ``extra``."""
        snap.wait()
        return restore_tree(snap.tree, self.model, self.optimizers, self.rng_streams, extra)


# -- peer replication --------------------------------------------------------------------


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
    """Ring replication: send ``snap`` to the next rank of ``ranks``, keep the previous one's.

    Collective over ``group`` (a diagnostic Gloo group whose members are ``ranks``).
    Returns the replica received from the previous rank of the ring.
    """
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
    """Reverse ring: return ``held`` to its owner and receive this rank's own replica.

    Collective over ``group``. A rank that holds nothing sends nothing; the result is
    ``None`` when the next rank holds nothing for this rank.
    """
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
