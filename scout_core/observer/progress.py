"""The lock-free progress record a trainer publishes into and its observer reads.

Each trainer owns one shared-memory record (192 int64 words) in an anonymous ``memfd``,
inherited by its observer, and publishes the step, an op id, its :class:`Stage` and the
pending collective's fingerprint. Contract: the observer reads under a seqlock and never
takes a lock the trainer could hold, so a frozen trainer cannot stop it reading the last
published state. Docs: docs/internals.md, "The progress record".
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "NO_FINGERPRINT",
    "RING",
    "ObserverState",
    "ProgressRecord",
    "Publisher",
    "Snapshot",
    "Stage",
]

RING = 32
"""Recent collectives kept in the record."""
_RING_AT = 32
_ENTRY = 5
WORDS = _RING_AT + _ENTRY * RING
SIZE = WORDS * 8
_MAGIC = 0x5C0_0B5_0003

SEQ, OP_ID, STEP, STAGE, FP0, FP1, FP2, CLOSING = range(8)
ARMED, STATE, ROUNDS, COLLS, STOREOPS, PID, MAGIC = range(8, 15)
PEER, RING_N = 16, 17

NO_FINGERPRINT: tuple[int, int, int] = (0, 0, 0)
"""Fingerprint words published outside a collective."""

_READ_RETRIES = 2000


class Stage(IntEnum):
    """Where the trainer last said it was; the value is what the record stores."""

    IDLE = 0
    LAYER = 1
    COLLECTIVE = 2
    DATALOADER = 3
    CHECKPOINT_READ = 4
    CHECKPOINT_WRITE = 5
    OPTIMIZER = 6


class ObserverState(IntEnum):
    """Lifecycle of the observer, as it reports it in the record."""

    STARTING = 0
    JOINED = 1
    DEGRADED = 2  # some peers' observers never joined; rounds cannot run
    FAILED = 3  # could not reach its store at all
    EXITED = 4


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of the trainer's words."""

    op_id: int
    step: int
    stage: Stage
    fingerprint: tuple[int, int, int]
    closing: bool
    torn: bool = False
    """The trainer stopped in the middle of a publish; the words may mix two publishes."""
    peer: int | None = None
    """The pending point-to-point operation's partner (a global rank), if any."""


def _new_memory() -> int:
    """A descriptor of ``SIZE`` zeroed bytes of shared memory with no name on disk."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("scout-progress", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        fd, path = tempfile.mkstemp(prefix="scout-progress-")
        os.unlink(path)
    os.ftruncate(fd, SIZE)
    return fd


def _new_event() -> tuple[int, int]:
    """(read end, write end) of the local progress event."""
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        return fd, fd
    r, w = os.pipe()  # pragma: no cover - non-Linux
    os.set_blocking(r, False)  # pragma: no cover
    os.set_blocking(w, False)  # pragma: no cover
    return r, w  # pragma: no cover


class ProgressRecord:
    """The shared words plus the progress event: the trainer's (:meth:`create`, written only
    through a :class:`Publisher`) or the observer's (:meth:`attach`)."""

    def __init__(self, mem_fd: int, event_r: int, event_w: int, *, create: bool) -> None:
        self.mem_fd = mem_fd
        self.event_r = event_r
        self.event_w = event_w
        if not create and os.fstat(mem_fd).st_size < SIZE:
            raise ValueError("the shared memory is not a SCOUT progress record of this version")
        self._map = mmap.mmap(mem_fd, SIZE)
        self.words = memoryview(self._map).cast("q")
        if create:
            self.words[MAGIC] = _MAGIC
        elif self.words[MAGIC] != _MAGIC:
            raise ValueError("the shared memory is not a SCOUT progress record of this version")

    @classmethod
    def create(cls) -> ProgressRecord:
        """A fresh record owned by the trainer."""
        r, w = _new_event()
        return cls(_new_memory(), r, w, create=True)

    @classmethod
    def attach(cls, mem_fd: int, event_r: int, event_w: int) -> ProgressRecord:
        """The observer's view of a record created by its trainer."""
        return cls(mem_fd, event_r, event_w, create=False)

    def fds(self) -> tuple[int, ...]:
        """Descriptors the observer must inherit."""
        return tuple(sorted({self.mem_fd, self.event_r, self.event_w}))

    def read(self) -> Snapshot:
        """A consistent snapshot, or the last words seen marked ``torn``."""
        w = self.words
        vals: list[int] = []
        peer = 0
        for attempt in range(_READ_RETRIES):
            s1 = w[SEQ]
            vals = w[OP_ID : SEQ + 8].tolist()
            peer = w[PEER]
            if not s1 & 1 and w[SEQ] == s1:
                return self._snapshot(vals, peer, torn=False)
            if attempt % 64 == 63:
                time.sleep(0.0005)  # let a preempted writer finish
        return self._snapshot(vals, peer, torn=True)

    @staticmethod
    def _snapshot(vals: list[int], peer: int, *, torn: bool) -> Snapshot:
        op_id, step, stage, f0, f1, f2, closing = vals
        try:
            st = Stage(stage)
        except ValueError:
            st = Stage.IDLE
            torn = True
        return Snapshot(
            op_id, step, st, (f0, f1, f2), bool(closing), torn, None if peer <= 0 else peer - 1
        )

    def recent(self) -> tuple[list[tuple[int, int, tuple[int, int, int]]], bool]:
        """The recent collectives, oldest first, as (op id, step, fingerprint); and whether
        the ring still holds every collective since the start."""
        w = self.words
        ring: list[int] = []
        count = 0
        for attempt in range(_READ_RETRIES):
            s1 = w[SEQ]
            count = w[RING_N]
            ring = w[_RING_AT:WORDS].tolist()
            if not s1 & 1 and w[SEQ] == s1:
                break
            if attempt % 64 == 63:
                time.sleep(0.0005)
        out = []
        for n in range(max(0, count - RING), count):
            i = _ENTRY * (n % RING)
            op, step, f0, f1, f2 = ring[i : i + _ENTRY]
            out.append((op, step, (f0, f1, f2)))
        return out, count <= RING

    def history(self) -> dict[int, tuple[int, int, int]]:
        """The recent collectives: op id → fingerprint (at most :data:`RING`)."""
        return {op: fp for op, _, fp in self.recent()[0]}

    def template(self, snap: Snapshot) -> tuple[int, int, int] | None:
        """What this rank entered at the pending collective's position (its index among
        the step's collectives on the same group) in the previous step; None outside a
        collective, at the first step, or when the ring no longer holds that whole step."""
        if snap.stage is not Stage.COLLECTIVE or snap.step < 1:
            return None
        entries, complete = self.recent()
        word = snap.fingerprint[1]
        if not complete and (not entries or entries[0][1] >= snap.step - 1):
            return None  # the ring may have dropped the start of the previous step
        position = sum(
            1 for op, step, fp in entries if step == snap.step and fp[1] == word and op < snap.op_id
        )
        before = [fp for _, step, fp in entries if step == snap.step - 1 and fp[1] == word]
        return before[position] if position < len(before) else None

    def wait_for_progress(self, timeout_s: float) -> bool:
        """Arm the event and sleep until the trainer signals or ``timeout_s`` passes."""
        self.words[ARMED] = 1
        ready, _, _ = select.select([self.event_r], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError):
            os.read(self.event_r, 8)
        return True

    def set_observer_word(self, index: int, value: int) -> None:
        """Write one of the observer-owned words (state, counters, pid)."""
        self.words[index] = value

    def observer_word(self, index: int) -> int:
        return int(self.words[index])

    def close(self) -> None:
        """Unmap and close this side's descriptors (idempotent)."""
        try:
            self.words.release()
            self._map.close()
        except (ValueError, BufferError):
            pass
        for fd in {self.mem_fd, self.event_r, self.event_w}:
            with contextlib.suppress(OSError):
                os.close(fd)


class Publisher:
    """The trainer's hot-path writer. Every call is one publish, ``OP_ID`` + 1.

    Thread-safe (one lock: a seqlock has one writer at a time); a few hundred nanoseconds
    per call (``benchmarks/observer_cost.py``)."""

    def __init__(self, record: ProgressRecord) -> None:
        self._w = record.words
        self._event_w = record.event_w
        self._lock = threading.Lock()
        self._op = int(self._w[OP_ID])
        self._step = int(self._w[STEP])
        self._ring_n = int(self._w[RING_N])
        self._signal = _eventfd_signal if record.event_r == record.event_w else _pipe_signal

    @property
    def step(self) -> int:
        return self._step

    @property
    def op_id(self) -> int:
        return self._op

    def publish(self, stage: int, fp: tuple[int, int, int] = NO_FINGERPRINT) -> None:
        """Enter ``stage`` (with the pending collective's fingerprint, if any)."""
        w = self._w
        with self._lock:
            seq = w[SEQ] + 1
            w[SEQ] = seq
            self._op += 1
            w[OP_ID] = self._op
            w[STAGE] = stage
            w[FP0], w[FP1], w[FP2] = fp
            w[PEER] = 0
            w[SEQ] = seq + 1
            if w[ARMED]:
                w[ARMED] = 0
                self._signal(self._event_w)

    def enter_collective(self, fp: tuple[int, int, int], peer: int | None = None) -> None:
        """Published *before* entering a collective that may block; also kept in the ring."""
        w = self._w
        with self._lock:
            seq = w[SEQ] + 1
            w[SEQ] = seq
            self._op += 1
            op = self._op
            w[OP_ID] = op
            w[STAGE] = Stage.COLLECTIVE
            w[FP0], w[FP1], w[FP2] = fp
            w[PEER] = 0 if peer is None else peer + 1
            n = self._ring_n
            at = _RING_AT + _ENTRY * (n % RING)
            w[at], w[at + 1], w[at + 2], w[at + 3], w[at + 4] = op, self._step, fp[0], fp[1], fp[2]
            self._ring_n = n + 1
            w[RING_N] = n + 1
            w[SEQ] = seq + 1
            if w[ARMED]:
                w[ARMED] = 0
                self._signal(self._event_w)

    def exit_collective(self) -> None:
        self.publish(Stage.IDLE)

    def leave(self) -> None:
        """Back to ``IDLE`` after a stage."""
        self.publish(Stage.IDLE)

    def set_step(self, step: int) -> None:
        """Publish the optimizer step (a publish of its own, stage ``IDLE``)."""
        w = self._w
        with self._lock:
            seq = w[SEQ] + 1
            w[SEQ] = seq
            self._op += 1
            self._step = step
            w[OP_ID] = self._op
            w[STEP] = step
            w[STAGE] = Stage.IDLE
            w[FP0] = w[FP1] = w[FP2] = 0
            w[PEER] = 0
            w[SEQ] = seq + 1
            if w[ARMED]:
                w[ARMED] = 0
                self._signal(self._event_w)

    def advance_step(self) -> None:
        self.set_step(self._step + 1)

    def mark_closing(self) -> None:
        """Tell the observer the trainer is shutting it down, and wake it."""
        self._w[CLOSING] = 1
        self._signal(self._event_w)


def _eventfd_signal(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.eventfd_write(fd, 1)


def _pipe_signal(fd: int) -> None:  # pragma: no cover - non-Linux
    with contextlib.suppress(BlockingIOError, OSError):
        os.write(fd, b"\x01")
