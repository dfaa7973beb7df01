"""Start SCOUT's helper processes from one thread that lives as long as the trainer.

Contract: :func:`spawn` starts every helper on one daemon thread of this module, because
Linux ties ``PR_SET_PDEATHSIG`` to the thread that created the child: it then fires only
when the trainer ends, even if ``scout.enable`` ran on a setup thread that returned. The
test harness replaces :data:`start` (``scout_core/testing/_helpers.py``). Docs:
docs/observer.md, "The observer process".
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

__all__ = [
    "Helper",
    "die_with_parent",
    "parent_alive",
    "read_spec_fd",
    "spawn",
    "spec_fd",
    "start",
]

_PR_SET_PDEATHSIG = 1

_requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()


class _Spawner:
    """The one spawner thread of this process (started on first use)."""

    lock = threading.Lock()
    thread: threading.Thread | None = None


def _serve() -> None:
    while True:
        fn, future = _requests.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the caller, who re-raises it
            future.set_exception(exc)


def _on_spawner_thread(fn: Callable[[], Any]) -> Any:
    with _Spawner.lock:
        if _Spawner.thread is None or not _Spawner.thread.is_alive():
            _Spawner.thread = threading.Thread(target=_serve, name="scout-spawner", daemon=True)
            _Spawner.thread.start()
    future: Future[Any] = Future()
    _requests.put((fn, future))
    return future.result()


class Helper(Protocol):
    """A started helper: the part of :class:`subprocess.Popen` SCOUT uses."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def _popen(argv: Sequence[str], pass_fds: Sequence[int]) -> Helper:
    return subprocess.Popen(
        list(argv), pass_fds=tuple(pass_fds), stdin=subprocess.DEVNULL, start_new_session=True
    )


start: Callable[[Sequence[str], Sequence[int]], Helper] = _popen
"""Make the process for ``argv``, passing ``pass_fds``, in its own session (module note)."""


def spawn(args: Sequence[str], pass_fds: Sequence[int]) -> Helper:
    """``python <args>`` in its own session, started on the spawner thread (module note)."""
    argv = [sys.executable, *args]
    proc: Helper = _on_spawner_thread(lambda: start(argv, pass_fds))
    return proc


def spec_fd(text: str) -> int:
    """A descriptor holding ``text`` (close it after the child started)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("scout-spec", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        fd, path = tempfile.mkstemp(prefix="scout-spec-")
        os.unlink(path)
    data = text.encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_spec_fd(fd: int) -> str:
    """What :func:`spec_fd` wrote (the child's side); closes the descriptor."""
    chunks = []
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def die_with_parent(parent_pid: int) -> None:
    """The child's side of the module note: SIGKILL when the thread that started this
    process ends (Linux), and exit now if ``parent_pid`` already died before that."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if not parent_alive(parent_pid):  # the parent died before prctl took effect
        os._exit(1)


def parent_alive(parent_pid: int) -> bool:
    """The child's side: whether ``parent_pid``, the trainer that started it, is still its
    parent. The test harness replaces it where a forker is the parent instead."""
    return os.getppid() == parent_pid
