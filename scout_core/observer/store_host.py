"""The observers' own c10d store, hosted by a small process of its own beside the lowest rank.

Contract: the store host serves the observers' ``TCPStore`` and nothing else, so it keeps
answering while a trainer is frozen and survives any one observer. It dies with its
trainer; on ``session.close()`` it rings ``shutdown`` and lingers until the observers
closed, or :data:`LINGER_S`. Docs: docs/observer.md, "Store address rule".
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from dataclasses import dataclass
from datetime import timedelta

# Public as torch.distributed.TCPStore, but torch's stubs declare it only here.
from torch._C._distributed_c10d import TCPStore

from scout_core.errors import ScoutError
from scout_core.observer.spawn import Helper, die_with_parent, read_spec_fd, spawn, spec_fd

__all__ = ["LINGER_S", "SHUTDOWN", "StoreHost", "first_unrung_bell", "ring", "serve"]

SHUTDOWN = "shutdown"
"""The bell value rung when the store host's trainer closes: diagnosis is over."""
LINGER_S = 2.0
_START_TIMEOUT_S = 60.0  # interpreter + torch import on a loaded machine


def first_unrung_bell(store: TCPStore, start: int = 1) -> int:
    """The number of the next diagnosis round (rounds are numbered from 1)."""
    n = start
    while store.check([f"bell/{n}"]):
        n += 1
    return n


def ring(store: TCPStore, n: int, value: str) -> bool:
    """Ring bell ``n`` with ``value`` unless someone rang it first; whether we did."""
    return bool(store.compare_set(f"bell/{n}", "", value).decode() == value)


@dataclass(frozen=True)
class _HostSpec:
    addr: str
    port: int
    observed: int
    trainer_pid: int
    report_fd: int
    stop_fd: int


class StoreHost:
    """The trainer's handle on the store host process."""

    def __init__(self, proc: Helper, port: int, stop_w: int) -> None:
        self.proc = proc
        self.port = port
        self._stop_w = stop_w
        self._closed = False

    @classmethod
    def start(cls, addr: str, port: int, *, observed: int) -> StoreHost:
        """Start the host on ``port`` (0: any free port); :class:`ScoutError` if it cannot."""
        report_r, report_w = os.pipe()
        stop_r, stop_w = os.pipe()
        spec = _HostSpec(addr, port, observed, os.getpid(), report_w, stop_r)
        fd = spec_fd(json.dumps(spec.__dict__))
        try:
            proc = spawn(["-m", "scout_core.observer", "store", str(fd)], (fd, report_w, stop_r))
        finally:
            for mine in (fd, report_w, stop_r):
                os.close(mine)
        answer = _read_line(report_r, _START_TIMEOUT_S)
        os.close(report_r)
        if answer.startswith("port "):
            return cls(proc, int(answer.split()[1]), stop_w)
        os.close(stop_w)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=5)
        reason = answer.removeprefix("error ").strip() or f"it exited with {proc.poll()}"
        where = f"port {port}" if port else "a free port"
        raise ScoutError(f"the observers' store could not start on {addr}:{where}: {reason}")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Ask the host to stop (it lingers for the other observers), then reap it."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.close(self._stop_w)
        try:
            self.proc.wait(timeout=LINGER_S + 5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read_line(fd: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"error no answer within {timeout_s:g} s"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").split("\n", 1)[0]


def serve(fd: int) -> int:
    """The host process: ``python -m scout_core.observer store <spec fd>``."""
    spec = _HostSpec(**json.loads(read_spec_fd(fd)))
    die_with_parent(spec.trainer_pid)
    try:
        store = TCPStore(
            spec.addr, spec.port, None, True, timeout=timedelta(seconds=30), wait_for_workers=False
        )
    except (RuntimeError, OSError) as exc:
        text = " ".join(str(exc).split("\n")[0].split())
        os.write(spec.report_fd, f"error {text}\n".encode())
        return 1
    os.write(spec.report_fd, f"port {store.port}\n".encode())
    os.close(spec.report_fd)
    while True:  # until the trainer closes the stop pipe (or dies, and takes us with it)
        try:
            if not os.read(spec.stop_fd, 64):
                break
        except InterruptedError:
            continue
    with contextlib.suppress(RuntimeError, OSError):
        n = first_unrung_bell(store)
        while not ring(store, n, SHUTDOWN):
            n = first_unrung_bell(store, n)
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline and store.add("obs/closed", 0) < spec.observed:
            time.sleep(0.05)
    return 0
