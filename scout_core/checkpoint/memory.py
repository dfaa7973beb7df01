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
(restore, persist, replicate). On CPU the copy is a plain memory copy.

[Buffers are reused]
A generation the gate no longer names (a ``latest`` replaced by the next capture,
a ``verified`` replaced at a cycle close, a dropped candidate) is *released*: its
host buffers go to a pool, and the next capture copies into them instead of
allocating (:class:`_HostCopier` matches each live tensor to a released buffer of
the same dtype, shape and stride). On CPU that saves the allocation
and the page faults of first-touch memory, which cost as much as the copy itself;
on CUDA it saves the pinned allocation (``cudaHostAlloc``, milliseconds per
megabyte). Every tensor is still copied at every capture: PyTorch's version
counters miss writes through ``.data`` (which ZeRO and Megatron use), so skipping
"unchanged" tensors could keep stale state. A released snapshot must not be read
any more; what a capture does not reuse is freed, so the gate never holds more
than three generations' worth of host memory (:meth:`InMemoryCheckpoints.held_bytes`;
:attr:`~InMemoryCheckpoints.peak_bytes` is the most it held at once). A lean gate
(``Config.gate_memory``, the coordinator) holds two.

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
    buffers: Buffers = field(default_factory=dict, repr=False)
    """The host buffers the capture filled, by layout (returned to the pool on release)."""

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


Buffers = dict[tuple[Any, ...], list[torch.Tensor]]
"""Host buffers by the layout they hold (dtype, shape, stride, source device)."""


def _source_key(t: torch.Tensor) -> tuple[Any, ...]:
    # Any buffer of the same layout will do: every capture copies every tensor whole.
    return (t.dtype, tuple(t.shape), tuple(t.stride()), t.device.type)


class _HostCopier:
    """Copies tensors to host memory: async on a side stream for CUDA, a memory copy on
    CPU; into a released buffer of the same source when the pool has one."""

    def __init__(self) -> None:
        self._stream: Any = None
        self._used = False
        self.pool: Buffers = {}
        """Released buffers, reused by the next capture (which frees what it leaves)."""
        self.made: Buffers = {}
        """The buffers of the capture in progress."""

    def begin(self) -> None:
        self._used = False
        self.made = {}

    def _buffer(self, key: tuple[Any, ...], t: torch.Tensor, pinned: bool) -> torch.Tensor:
        free = self.pool.get(key)
        if free:
            return free.pop()
        # empty_like keeps a dense tensor's strides (as clone does) and makes an
        # overlapping one (an expanded view) contiguous, so the copy can write it.
        return torch.empty_like(t, device="cpu", pin_memory=pinned)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        key = _source_key(t)
        if t.device.type != "cuda":
            host = self._buffer(key, t, pinned=False)
            host.copy_(t)
        else:
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=t.device)  # type: ignore[no-untyped-call]  # torch.cuda.Stream is unannotated
            if not self._used:
                # The copy must see the optimizer's writes, which are queued on the
                # training stream.
                self._stream.wait_stream(torch.cuda.current_stream(t.device))
                self._used = True
            host = self._buffer(key, t, pinned=True)
            with torch.cuda.stream(self._stream):
                host.copy_(t, non_blocking=True)
            t.record_stream(self._stream)  # keep t's memory alive until the copy ran
        self.made.setdefault(key, []).append(host)
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
        self.reuse = True
        """Copy into released generations' buffers (the default). ``False`` allocates
        fresh host buffers at every capture, as the gate did before buffer reuse: the
        baseline ``benchmarks/checkpoint_capture.py`` measures against."""
        self.peak_bytes = 0
        """The most host bytes the gate held at any moment (measured at the end of each
        capture's copy, when old generations, leftover pool and the new copy coexist)."""
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

    def capture(
        self, step: int, extra: Mapping[str, Any] | None = None, *, rotating: bool = False
    ) -> Snapshot:
        """Copy the live state into host memory as the new ``latest`` generation.

        The replaced ``latest`` is released first (unless it is the candidate or the
        verified generation), and so is the ``verified`` generation when ``rotating``
        (a cycle close follows: :meth:`rotate` replaces it), so the copy reuses their
        buffers and the gate holds at most three generations at any moment.
        """
        start = time.monotonic()
        old = self.latest
        self.latest = None
        self._release(old)
        if rotating and self.candidate is not None:
            dropped, self.verified = self.verified, None
            self._release(dropped)
        if not self.reuse:
            self._copier.pool = {}
        self._copier.begin()
        tree = capture_tree(self.model, self.optimizers, self.rng_streams, extra, self._copier)
        event = self._copier.finish()
        self.peak_bytes = max(self.peak_bytes, self._bytes(self._copier.made))
        self._copier.pool = {}  # what this capture did not reuse is freed
        snap = Snapshot(step=step, tree=tree, _event=event, buffers=self._copier.made)
        snap.blocking_s = time.monotonic() - start
        self.latest = snap
        return snap

    def _release(self, snap: Snapshot | None) -> None:
        """Return ``snap``'s buffers to the pool if no generation names it any more."""
        if snap is None or any(snap is g for g in (self.latest, self.candidate, self.verified)):
            return
        snap.wait()  # an asynchronous copy into the buffers must end before reuse
        for key, tensors in snap.buffers.items():
            self._copier.pool.setdefault(key, []).extend(tensors)
        snap.buffers = {}

    def rotate(self) -> None:
        """Cycle boundary: verified ← candidate (when one exists), candidate ← latest."""
        if self.latest is None:
            raise CheckpointError("cycle boundary without a latest in-memory checkpoint")
        if self.candidate is not None:
            old, self.verified = self.verified, self.candidate
            self._release(old)
        self.candidate = self.latest

    def drop_candidate(self) -> Snapshot | None:
        """Forget the candidate (it can no longer be promoted); return it."""
        dropped, self.candidate = self.candidate, None
        self._release(dropped)
        return dropped

    def held_bytes(self) -> int:
        """Host bytes this rank's gate holds: every distinct buffer of the generations
        and of the reuse pool (a generation named twice counts once)."""
        return self._bytes()

    def _bytes(self, *more: Buffers) -> int:
        seen: dict[int, int] = {}
        snaps = {id(g): g for g in (self.latest, self.candidate, self.verified) if g is not None}
        groups = [s.buffers for s in snaps.values()] + [self._copier.pool, *more]
        for buffers in groups:
            for tensors in buffers.values():
                for t in tensors:
                    seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())

    def state_bytes(self) -> int:
        """Bytes of the live model and optimizer state (what one generation copies)."""
        total = 0
        for t in self.model.state_dict().values():
            if isinstance(t, torch.Tensor):
                total += _local(t).numel() * t.element_size()
        for opt in self.optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        total += _local(v).numel() * v.element_size()
        return total

    def get(self, selection: Selection) -> Snapshot | None:
        """The generation a retrieval selected, or ``None`` when memory lacks it."""
        return self.latest if Selection(selection) is Selection.LATEST else self.verified

    def restore(
        self, snap: Snapshot, extra: MutableMapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write ``snap`` back into the live model, optimizers, RNG and ``extra``."""
        snap.wait()
        return restore_tree(snap.tree, self.model, self.optimizers, self.rng_streams, extra)


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


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
