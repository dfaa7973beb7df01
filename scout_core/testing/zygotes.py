"""Pre-imported parents (zygotes) that fork the ranks of :func:`run_ranks`.

A fresh interpreter spends 3-4 CPU-seconds in ``import torch`` (DTensor and SCOUT's
own modules about 3 more, Megatron-Core about 11) before a rank does any work; on a
2-core machine that was most of a multi-rank test. A zygote pays it once: it is started
with the harness's environment and the ranks' import-time variables, imports torch and
SCOUT's modules (from the harness's own ``scout_core``), and forks each rank from there
(``_zygote.py``). A forked rank still
runs in its own process and session, with its own environment, working directory,
log file, parent-death signal and exit code, and starts with no torch state: the
zygote never runs an op or joins a group.

What differs from a fresh interpreter, and how it is kept out of the results:

* Variables read while importing (threads, allocators, CUDA, ``PYTHON*``) are part of
  the zygote's key (:data:`KEY_PREFIXES`); ranks whose values differ get their own
  zygote. Everything else is set in the child before the target runs, so
  ``os.environ`` is the rank's own, but ``/proc/<pid>/environ`` (the block the process
  was started with) shows the zygote's.
* Forked ranks share the zygote's string-hash seed, so a bug that made ranks disagree on
  a set's iteration order would no longer show here; the example and ``torchrun``
  tests still start fresh interpreters.
* A zygote must hold one thread when it forks. numpy's OpenBLAS would start a pool
  when torch imports numpy, so a zygote runs it with one thread unless the ranks set
  ``OPENBLAS_NUM_THREADS`` (numpy's BLAS is single-threaded in forked ranks; torch's
  own threads are unchanged); likewise pyarrow's jemalloc runs without its background
  thread unless the ranks set ``JE_ARROW_MALLOC_CONF``. A zygote that still reports
  more threads (a preloaded module started one) is not used; ranks start fresh instead.

``SCOUT_TEST_FRESH_RANKS=1`` turns zygotes off: every rank is a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["FRESH_ENV", "KEY_PREFIXES", "PRELOAD_ENV", "ForkedRank", "fork_rank"]

FRESH_ENV = "SCOUT_TEST_FRESH_RANKS"
PRELOAD_ENV = "SCOUT_TEST_PRELOAD"
"""Comma-separated modules a zygote imports besides torch (e.g. ``megatron.core``)."""
KEY_PREFIXES = (
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "NCCL_",
    "NVTE_",
    "LD_",
    "PYTHON",
    "TMPDIR",
    "JE_",
    "DS_",
    PRELOAD_ENV,
)
"""Variables that may be read while importing: ranks share a zygote only if these agree."""
_ONE_THREAD = {
    "OPENBLAS_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
"""Unless the ranks set them: numpy's OpenBLAS starts its thread pool when torch imports
numpy, and pyarrow's bundled jemalloc a background thread when it loads (TorchTitan's
data loader imports ``datasets``, which imports pyarrow); a zygote must hold a single
thread to fork."""
_READ_LATER = ("TORCHELASTIC_",)  # torch.distributed.elastic reads its error file when it records
_MAX_ZYGOTES = 6
_READY_TIMEOUT_S = 180.0
_ZYGOTE = Path(__file__).with_name("_zygote.py")


class ForkedRank:
    """A rank forked by a zygote: the part of :class:`subprocess.Popen` the harness uses."""

    def __init__(self, zygote: _Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class _Zygote:
    """One zygote process and the line protocol to it (see ``_zygote.py``)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(_ZYGOTE), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # preloads' import warnings; a failure reads as EOF
            env=dict(env),
            start_new_session=True,
        )
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self._live: set[int] = set()
        self.dead = False
        ready = self._next(_READY_TIMEOUT_S)
        self.usable = ready is not None and ready.get("threads") == 1

    def fork(self, request: dict[str, Any]) -> ForkedRank | None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self._died()
            return None
        reply = self._next(30.0)
        if reply is None:
            return None
        pid = int(reply["pid"])
        self._live.add(pid)
        return ForkedRank(self, pid)

    def exit_code(self, pid: int) -> int | None:
        self._drain()
        return self._exits.pop(pid, None)

    @property
    def busy(self) -> bool:
        self._drain()
        return bool(self._live)

    def close(self) -> None:
        with contextlib.suppress(OSError, ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next reply that is not an exit report, or None if the zygote ended."""
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._drain_one(max(0.0, deadline - time.monotonic()))
            if message is None:
                self._died()
                return None
            if "exit" not in message:
                return message

    def _drain(self) -> None:
        """Read every message already sent."""
        while self._drain_one() is not None:
            pass

    def _drain_one(self, wait_s: float = 0.0) -> dict[str, Any] | None:
        """Read one message (recording exit reports); None if none came or the pipe ended."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + wait_s
        while b"\n" not in self._buffer:
            if self.dead:
                return None
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self._died()
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        if "exit" in message:
            self._exits[int(message["exit"])] = int(message["code"])
            self._live.discard(int(message["exit"]))
        return message

    def _died(self) -> None:
        # Its children carry a parent-death signal: they were killed with it.
        self.dead = self.usable = False
        for pid in self._live:
            self._exits.setdefault(pid, -signal.SIGKILL)
        self._live.clear()


_pool: OrderedDict[tuple[tuple[str, str], ...], _Zygote] = OrderedDict()
_refused: set[tuple[tuple[str, str], ...]] = set()


def _read_on_import(name: str) -> bool:
    return name.startswith(KEY_PREFIXES) and not name.startswith(_READ_LATER)


def _key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if _read_on_import(k)))


def _zygote_for(env: Mapping[str, str]) -> _Zygote | None:
    key = _key(env)
    if key in _refused:
        return None
    zygote = _pool.get(key)
    if zygote is not None and zygote.dead:
        zygote.close()
        del _pool[key]
        zygote = None
    if zygote is None:
        if len(_pool) >= _MAX_ZYGOTES:
            idle = next((k for k, z in _pool.items() if not z.busy), None)
            if idle is None:
                return None
            _pool.pop(idle).close()
        # The import-time variables are the ranks'; the rest the harness's own, so the
        # zygote carries no call's values (a test may look for them in /proc/*/environ).
        own = {k: v for k, v in os.environ.items() if not _read_on_import(k)}
        zygote = _Zygote({**own, **_ONE_THREAD, **dict(key)})
        if not zygote.usable:
            zygote.close()
            _refused.add(key)
            return None
        _pool[key] = zygote
    _pool.move_to_end(key)
    return zygote


def fork_rank(
    spec_path: Path, log_path: Path, env: Mapping[str, str], cwd: str
) -> ForkedRank | None:
    """Fork one rank from the zygote for ``env``; None where a fresh process must be used.

    That is: zygotes are off (:data:`FRESH_ENV`), not on Linux, called off the main
    thread (a zygote's parent-death signal follows the thread that started it), or no
    usable zygote could be had.
    """
    if (
        env.get(FRESH_ENV, "") not in ("", "0")  # the ranks' environment: the harness's + env=
        or not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None
    zygote = _zygote_for(env)
    if zygote is None:
        return None
    request = {"spec": str(spec_path), "log": str(log_path), "env": dict(env), "cwd": cwd}
    return zygote.fork(request)


@atexit.register
def _close_all() -> None:
    while _pool:
        _pool.popitem()[1].close()
