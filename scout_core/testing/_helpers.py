"""Forked helper processes for ranks forked by a zygote (``_zygote.py``; stdlib only).

A rank that enables SCOUT starts its observer, and the lowest rank the observers' store
host, as ``python -m scout_core.observer ...`` (:func:`scout_core.observer.spawn.spawn`):
a fresh interpreter that spends about 2 CPU-seconds importing torch. On a 2-core machine
that was half the CPU time of an observer test. Here a rank forked by a zygote forks,
while it still holds one thread, a *helper forker*: a copy of the zygote's pre-imported
process that waits on a Unix socket. The rank's :data:`scout_core.observer.spawn.start`
is replaced by :func:`_Client.start`, which sends the command, the descriptors to pass
(``SCM_RIGHTS``), the environment and the working directory; the forker forks the helper,
which runs the module as ``-m`` would, and it reports the helper's pid and exit code.

What stays as in :func:`subprocess.Popen`: the helper's pid is real (signals reach it),
it runs in its own session with stdin on ``/dev/null``, the same stdout and stderr,
the rank's environment and working directory at the time of the start, exactly the
passed descriptors at their numbers, and ``Popen.returncode``'s convention. What differs:
the helper's parent is the forker, so the parent-death chain is rank -> forker -> helper
(each dies with the one before it: the helper's ``die_with_parent`` is pointed at the
forker), the helper starts with the zygote's imports, and the rank has one more child,
the forker, whose pid it finds in ``SCOUT_TEST_HELPER_FORKER``. ``SCOUT_TEST_FRESH_HELPERS=1``
(or ``SCOUT_TEST_FRESH_RANKS=1``) starts fresh interpreters instead. A command that is not
``python -m <module> ...``, or a forker that is gone, also gets a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

_worker: Any = importlib.import_module("_worker")  # beside this script, as _zygote.py
FRESH_ENV = "SCOUT_TEST_FRESH_HELPERS"
FORKER_ENV = "SCOUT_TEST_HELPER_FORKER"
"""Set in a rank to its forker's pid: a child of the rank that the harness started."""
_MAX_FDS = 64
_PRELOAD = ("scout_core.observer.process",)
"""What every helper runs: imported once in the forker, so a helper starts at once."""
_PID_TIMEOUT_S = 30.0
_KILLED = -int(signal.SIGKILL)
"""The exit code reported when the forker went away before it could tell the real one
(it takes its helpers with it: they die with it)."""


def install(rank_pid: int) -> None:
    """In a freshly forked rank (one thread): fork the forker and make the rank's helper
    starts go through it. Does nothing when turned off (module note)."""
    if os.environ.get(FRESH_ENV) == "1" or os.environ.get("SCOUT_TEST_FRESH_RANKS") == "1":
        return
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        mine.close()
        _forker(theirs, rank_pid)  # never returns
    theirs.close()
    os.environ[FORKER_ENV] = str(pid)  # for a test that counts the rank's own children
    try:
        import scout_core.observer.spawn as spawn_module
    except ImportError:  # a rank that cannot import SCOUT starts nothing through it
        mine.close()
        return
    spawn_module.start = _Client(mine, spawn_module.start).start


class ForkedHelper:
    """A helper started by the forker: the part of :class:`subprocess.Popen` SCOUT uses."""

    def __init__(self, fd: int, pid: int, argv: Sequence[str]) -> None:
        self._fd = fd
        self._argv = list(argv)
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()  # the listener thread and close() both wait

    def _read_code(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                return None
            data = os.read(self._fd, 64)
            os.close(self._fd)
            self.returncode = int(data) if data.strip() else _KILLED
            return self.returncode

    def poll(self) -> int | None:
        return self._read_code(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_code(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self._argv, timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class _Client:
    """The rank's side: :meth:`start` replaces ``scout_core.observer.spawn.start``."""

    def __init__(self, sock: socket.socket, fresh: Any) -> None:
        self._sock = sock
        self._fresh = fresh
        self._dead = False

    def start(self, argv: Sequence[str], pass_fds: Sequence[int]) -> Any:
        if self._dead or len(argv) < 3 or argv[1] != "-m" or len(pass_fds) >= _MAX_FDS:
            return self._fresh(argv, pass_fds)
        reply_r, reply_w = os.pipe()
        request = {"argv": list(argv), "fds": list(pass_fds), "cwd": os.getcwd()}
        request["env"] = dict(os.environ)
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], [reply_w, *pass_fds])
        except OSError:
            self._dead = True
            os.close(reply_r)
            return self._fresh(argv, pass_fds)
        finally:
            os.close(reply_w)
        line = b""
        deadline = time.monotonic() + _PID_TIMEOUT_S
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([reply_r], [], [], 0.5)
            if ready:
                chunk = os.read(reply_r, 1)
                if not chunk:
                    break
                line += chunk
        if not line.endswith(b"\n"):
            self._dead = True
            os.close(reply_r)
            return self._fresh(argv, pass_fds)
        return ForkedHelper(reply_r, int(line), argv)


def _forker(sock: socket.socket, rank_pid: int) -> None:
    """The forker process: fork one helper per request, report pids and exit codes."""
    code = 0
    try:
        os.setsid()  # out of the rank's process group, as a helper started by Popen is
        _worker._die_with_parent(rank_pid)
        for name in _PRELOAD:
            with contextlib.suppress(Exception):  # the helper imports it and fails loudly
                __import__(name)
        me = os.getpid()
        replies: dict[int, int] = {}
        while True:
            ready, _, _ = select.select([sock], [], [], 0.05)
            if ready:
                message, fds, _, _ = socket.recv_fds(sock, 1 << 20, _MAX_FDS)
                if not message:
                    return  # the rank closed its end: it is gone
                request = json.loads(message)
                pid = os.fork()
                if pid == 0:
                    _helper(request, fds[1:], me)  # never returns
                for fd in fds[1:]:
                    os.close(fd)
                os.write(fds[0], f"{pid}\n".encode())
                replies[pid] = fds[0]
            _reap(replies)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def reaped() -> Iterator[tuple[int, int]]:
    """The children that ended since the last call, as ``(pid, Popen-style exit code)``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def _reap(replies: dict[int, int]) -> None:
    for pid, code in reaped():
        fd = replies.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, f"{code}\n".encode())
            os.close(fd)


def _helper(request: dict[str, Any], received: list[int], forker_pid: int) -> None:
    """In the forked helper: become ``python -m <module> <args>`` (module note)."""
    code = 1
    try:
        os.setsid()
        _worker._die_with_parent(forker_pid)
        targets = [int(fd) for fd in request["fds"]]
        # Move what arrived out of the way, then put each at the number the rank passed.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in received]
        keep = {0, 1, 2, *high}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for src, dst in zip(high, targets, strict=True):
            os.dup2(src, dst)  # inheritable, as Popen's pass_fds leaves them
        for src in high:
            if src not in targets:
                os.close(src)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if null != 0 and null not in targets:
            os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _point_parent_checks_at(forker_pid)
        # What `python -m` puts first on sys.path: the working directory, then PYTHONPATH.
        extra = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        sys.path[:0] = [entry for entry in extra if entry not in sys.path]
        module, args = request["argv"][2], request["argv"][3:]
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _point_parent_checks_at(forker_pid: int) -> None:
    """A helper checks that its parent is the rank; here its parent is the forker, which
    dies with the rank: check that one instead (module note)."""
    from scout_core.observer import spawn

    spawn.parent_alive = lambda parent_pid: os.getppid() == forker_pid
