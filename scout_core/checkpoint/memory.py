"""In-memory gate checkpoints in the spirit of GEMINI: capture, three generations, buffer reuse.

Contract: :class:`InMemoryCheckpoints` copies the post-optimizer training state into host
memory at an accepted boundary and keeps the gate's ``latest``, ``candidate`` and
``verified``: at most three copies, two under a lean gate. The copy of what only an
optimizer step writes overlaps the next iteration and ends before the next step writes. A
released generation's buffers are reused and must not be read any more. How and why:
docs/checkpoint_gate.md, "Capture cost".
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from scout_core.checkpoint.skeleton import flatten
from scout_core.checkpoint.state import capture_tree, restore_tree
from scout_core.decision.gate import Selection
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import RngStream
from scout_core.topology.shards import local_shard

__all__ = ["Snapshot", "InMemoryCheckpoints"]


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
        """Whether the copy has finished."""
        return self._event is None or bool(self._event.query())

    def nbytes(self) -> int:
        """Host bytes held by the snapshot's tensors."""
        _, tensors = flatten(self.tree)
        return sum(t.numel() * t.element_size() for t in tensors.values())


Buffers = dict[tuple[Any, ...], list[torch.Tensor]]
"""Host buffers by layout: dtype, shape, stride, and a CUDA source (pinned buffers)."""


def _source_key(t: torch.Tensor) -> tuple[Any, ...]:
    # Any buffer of the same layout will do: every capture copies every tensor whole.
    # Runs once per tensor: ``is_cuda`` costs a fifth of ``device.type``.
    return (t.dtype, t.shape, t.stride(), t.is_cuda)


class _CpuCopy:
    """One capture's deferred CPU copies, run on the worker thread; acts as a CUDA event."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._pairs = pairs
        self._error: BaseException | None = None
        self._done = threading.Event()

    def _run(self) -> None:
        try:
            hosts = [host for host, _ in self._pairs]
            lives = [live for _, live in self._pairs]
            # One call for every tensor: it releases the GIL once, where a loop of
            # ``copy_`` would take it back per tensor while the forward runs.
            torch._foreach_copy_(hosts, lives)
        except BaseException as exc:  # re-raised where the copy is waited for
            self._error = exc
        finally:
            self._pairs = []

    def synchronize(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise CheckpointError(f"the gate's background copy failed: {self._error}")

    def query(self) -> bool:
        return self._done.is_set()


class _CopyWorker:
    """One long-lived daemon thread that runs the gate's CPU copies in order (a thread per
    capture made it wait for ``Thread.start``: milliseconds on a busy host). It ends at
    :meth:`stop` or when the worker is garbage collected (it holds the queue, not the worker)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_CpuCopy | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        weakref.finalize(self, self._jobs.put, None)

    def submit(self, job: _CpuCopy) -> _CpuCopy:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=_serve, args=(self._jobs,), name="scout-gate-copy", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """End the thread after the copies queued so far (idempotent)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


def _serve(jobs: queue.SimpleQueue[_CpuCopy | None]) -> None:
    while (job := jobs.get()) is not None:
        try:
            job._run()
        finally:
            job._done.set()


class _HostCopier:
    """Copies tensors into host buffers (a pooled one of the same layout if any): on CUDA
    on a side stream; on CPU, :meth:`later` tensors on the worker thread, the rest at once."""

    def __init__(self) -> None:
        self._stream: Any = None
        self._used = False
        self.pool: Buffers = {}
        """Released buffers, reused by the next capture (which frees what it leaves)."""
        self.made: Buffers = {}
        self._deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.fresh = False
        """Whether the capture in progress allocated a buffer (the pool lacked one)."""
        self.worker = _CopyWorker()

    def begin(self) -> None:
        self._used = False
        self.fresh = False
        self.made = {}
        self._deferred = []

    def _buffer(self, key: tuple[Any, ...], t: torch.Tensor, pinned: bool) -> torch.Tensor:
        free = self.pool.get(key)
        return free.pop() if free else self._allocate(t, pinned)

    def _allocate(self, t: torch.Tensor, pinned: bool) -> torch.Tensor:
        self.fresh = True
        # empty_like keeps a dense tensor's strides (as clone does) and makes an
        # overlapping one (an expanded view) contiguous, so the copy can write it.
        return torch.empty_like(t, device="cpu", pin_memory=pinned)

    def later(self, t: torch.Tensor) -> torch.Tensor:
        """Copy ``t``, which only an optimizer step writes: on CPU after the capture returns."""
        # Inlines :meth:`__call__`'s CPU case: most tensors come here, and it took 12-15%
        # off the capture's blocking time (docs/replay.md, *Measured*).
        key = _source_key(t)
        if key[3]:
            return self(t)
        free = self.pool.get(key)
        host = free.pop() if free else self._allocate(t, pinned=False)
        self._deferred.append((host, t))
        made = self.made.get(key)
        if made is None:
            self.made[key] = [host]
        else:
            made.append(host)
        return host

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        # Runs once per tensor and the capture blocks for it: as little Python as it can.
        # (capture_tree detaches a tensor that requires grad before it gets here.)
        key = _source_key(t)
        if not key[3]:
            host = self._buffer(key, t, pinned=False)
            host.copy_(t)
        else:
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=t.device)  # type: ignore[no-untyped-call]  # torch.cuda.Stream is unannotated
            if not self._used:
                # The copy must see the optimizer's writes, queued on the training stream.
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
        deferred, self._deferred = self._deferred, []
        if deferred and not self._used:
            return self.worker.submit(_CpuCopy(deferred))
        for host, live in deferred:  # with a CUDA copy in flight, CPU tensors go now
            host.copy_(live)
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
        self._copier = _HostCopier()
        self.overlap = True
        """On CPU, copy parameters and optimizer state on the worker thread during the next
        forward and backward; ``False`` copies everything before :meth:`capture` returns."""
        self.reuse = True
        """Reuse released generations' buffers. ``False`` allocates fresh ones at every
        capture: the baseline of ``benchmarks/checkpoint_capture.py``."""
        self.peak_bytes = 0
        """The most host bytes the gate held at once (measured when a capture's buffers exist)."""
        self._hooks: list[RemovableHandle] = [
            opt.register_step_pre_hook(self._before_step) for opt in self.optimizers
        ]

    def _before_step(self, *_: Any) -> None:
        # The step writes what the copy reads, so it waits for the copy: device-side on
        # CUDA; on CPU for the worker thread (long done: it ran during forward and backward).
        snap = self.latest
        if snap is None or snap._event is None:
            return
        if isinstance(snap._event, _CpuCopy):
            snap.wait()
        elif torch.cuda.is_available():
            torch.cuda.current_stream().wait_event(snap._event)

    def settle(self) -> None:
        """Wait for every generation's copy; due before a restore writes the live state."""
        for snap in (self.latest, self.candidate, self.verified):
            if snap is not None:
                snap.wait()

    def close(self) -> None:
        """Wait for the copies in flight and remove the optimizer hooks (idempotent)."""
        self.settle()
        self._copier.worker.stop()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def capture(
        self, step: int, extra: Mapping[str, Any] | None = None, *, rotating: bool = False
    ) -> Snapshot:
        """Copy the live state into host memory as the new ``latest`` generation, first
        releasing the old one and, when ``rotating``, ``verified`` (their buffers are reused)."""
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
        later = self._copier.later if self.overlap else None
        tree = capture_tree(
            self.model, self.optimizers, self.rng_streams, extra, self._copier, later=later
        )
        # The peak is now; a capture that only reused released buffers cannot raise it.
        if self._copier.fresh:
            self.peak_bytes = max(self.peak_bytes, self._bytes(self._copier.made))
        event = self._copier.finish()  # last: the CPU copy starts here
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
        """Host bytes of every distinct buffer of the generations and the reuse pool."""
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
                total += local_shard(t).numel() * t.element_size()
        for opt in self.optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        total += local_shard(v).numel() * v.element_size()
        return total

    def get(self, selection: Selection) -> Snapshot | None:
        """The generation a retrieval selected, or ``None`` when memory lacks it."""
        return self.latest if Selection(selection) is Selection.LATEST else self.verified

    def restore(
        self, snap: Snapshot, extra: MutableMapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write ``snap`` back into the live model, optimizers, RNG and ``extra``."""
        self.settle()  # no copy may still read what the restore writes
        snap.wait()
        return restore_tree(snap.tree, self.model, self.optimizers, self.rng_streams, extra)
