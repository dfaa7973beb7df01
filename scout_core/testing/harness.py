"""Run one function on N local ranks with Gloo, an ephemeral port and a hard timeout.

Each rank is its own process running ``scout_core/testing/_worker.py``, the way
``torchrun`` starts trainers. On Linux it is forked from a zygote that has already
imported torch (``zygotes.py``: what that changes, and ``SCOUT_TEST_FRESH_RANKS=1``
to start every rank as a fresh interpreter instead). Nothing is pickled: the target
is named as ``"module:function"`` (or passed as a module-level function), arguments
and return values travel as JSON files.

[Why a process per rank and not multiprocessing]
Ranks must be killable as a unit (a test may SIGSTOP one of them), must never
outlive the test, and must not inherit the parent's torch state. Each worker runs
in its own session so the harness can kill its whole process tree, and asks the
kernel to SIGKILL it when the harness process dies (``PR_SET_PDEATHSIG``).

The rendezvous store is hosted by the harness process itself, never by a rank:
a frozen rank 0 must not take the store down with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from scout_core.errors import ScoutError
from scout_core.testing.zygotes import ForkedRank, fork_rank

__all__ = [
    "RankFailedError",
    "RankProcess",
    "RanksTimeoutError",
    "port_clash",
    "retry_on_port_clash",
    "run_ranks",
]

_T = TypeVar("_T")
_PORT_CLASH = ("EADDRINUSE", "Address already in use", "address already in use")


def port_clash(text: str) -> bool:
    """Whether a failure's text says a port was taken (by another process, between a
    test's pick of a free port and the bind that needed it)."""
    return any(marker in text for marker in _PORT_CLASH)


def retry_on_port_clash(run: Callable[[], _T], attempts: int = 3) -> _T:
    """``run()``, again (up to ``attempts`` times) when it fails because a port it picked
    was taken meanwhile: a test that passes a free port number on (a configured observer
    port, a launcher's master port) cannot hold the port until the bind, so it retries
    with a fresh pick instead of failing on another process's timing. Any other failure
    is raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return run()
        except (ScoutError, OSError, AssertionError) as exc:
            if attempt == attempts or not port_clash(str(exc)):
                raise
    raise AssertionError("unreachable")


_GRACE_AFTER_FAILURE_S = 5.0
_WORKER = Path(__file__).with_name("_worker.py")
MAIN_PREFIX = "file:"
"""How a target names a function of the running script (``_worker.py`` reads it)."""


class RankFailedError(ScoutError):
    """A rank raised or exited non-zero; the message carries its traceback."""


class RanksTimeoutError(ScoutError, TimeoutError):
    """The ranks did not all finish before the hard timeout; all were killed."""


@dataclass
class RankProcess:
    """One spawned rank: its process, the files it reports through."""

    rank: int
    proc: subprocess.Popen[bytes] | ForkedRank
    result_path: Path
    log_path: Path

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _target_name(fn: Callable[..., Any] | str) -> str:
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"target {fn!r} must look like 'package.module:function'")
        return fn
    module, qualname = fn.__module__, fn.__qualname__
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if "<locals>" in qualname or (module == "__main__" and not main_file):
        raise ValueError(
            f"{qualname} must be a module-level function importable by name "
            "(ranks are fresh processes)"
        )
    if module == "__main__":
        # A script's own function: each rank loads the script by path under another
        # name, as multiprocessing's spawn does, so its ``if __name__ == "__main__":``
        # block does not run again there.
        return f"{MAIN_PREFIX}{Path(str(main_file)).resolve()}:{qualname}"
    return f"{module}:{qualname}"


def _free_port_pair() -> int:
    """A loopback port ``p`` with ``p + 1`` free too (MASTER_PORT, and the observer store)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise OSError("no free pair of loopback ports found")


def _kill_tree(ranks: Sequence[RankProcess]) -> None:
    for r in ranks:
        if r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.proc.pid, signal.SIGKILL)
            # A forked rank may not have made its own session yet.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                r.proc.kill()
    for r in ranks:
        # A rank may have started helpers (observers) in their own sessions; those carry
        # a parent-death signal, so they follow their rank.
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(timeout=10)


def run_ranks(
    fn: Callable[..., Any] | str,
    world_size: int,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
    init_process_group: bool = True,
    on_start: Callable[[list[RankProcess]], None] | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` local ranks; return each rank's result.

    ``fn`` runs after ``torch.distributed`` is initialised with Gloo (unless
    ``init_process_group`` is false) and its return value must be JSON-serialisable.
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` (a free loopback port whose successor is free too) are set in each
    rank's environment, as torchrun sets them, plus ``SCOUT_TEST_RANK_DIR``, a scratch
    folder shared by the ranks of this call; ``env`` is applied last, so it may set
    ``MASTER_PORT`` itself (two jobs on adjacent ports). ``on_start`` is called in the
    harness once every rank is launched (fault tests use it to signal a rank).

    Raises :class:`RankFailedError` if a rank fails, :class:`RanksTimeoutError` after
    ``timeout_s``. Either way every rank has been killed before it returns.
    """
    import torch.distributed as dist  # test tooling; torch is a dependency

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    target = _target_name(fn)
    # TCPStore is public API; torch's stubs just do not re-export it.
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)  # type: ignore[attr-defined]
    master_port = _free_port_pair()
    scratch = Path(tempfile.mkdtemp(prefix="scout-ranks-"))
    ranks: list[RankProcess] = []
    try:
        for rank in range(world_size):
            spec = {
                "target": target,
                "args": list(args),
                "kwargs": dict(kwargs or {}),
                "rank": rank,
                "world_size": world_size,
                "store_port": store.port,
                "init_process_group": init_process_group,
                "timeout_s": timeout_s,
                "sys_path": [p for p in sys.path if p],
                "harness_pid": os.getpid(),
            }
            spec_path = scratch / f"spec-{rank}.json"
            spec_path.write_text(json.dumps(spec))
            log_path = scratch / f"log-{rank}.txt"
            child_env = dict(os.environ)
            child_env.update(
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(world_size),
                    "SCOUT_TEST_RANK_DIR": str(scratch),
                    # torchrun's variables, so code that derives addresses from them works
                    # as under torchrun (MASTER_PORT + 1 is kept free for code that used to
                    # put a store there).
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(master_port),
                }
            )
            child_env.update(env or {})  # may override MASTER_ADDR / MASTER_PORT
            proc = fork_rank(spec_path, log_path, child_env, os.getcwd()) or _start(
                spec_path, log_path, child_env
            )
            ranks.append(RankProcess(rank, proc, scratch / f"result-{rank}.json", log_path))
        if on_start is not None:
            on_start(ranks)
        _wait(ranks, timeout_s)
        return [_read_result(r) for r in ranks]
    finally:
        _kill_tree(ranks)
        del store


def _start(spec_path: Path, log_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A rank as a fresh interpreter (where no zygote can fork it)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, str(_WORKER), str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )


def _wait(ranks: list[RankProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while True:
        codes = [r.proc.poll() for r in ranks]
        if all(c is not None for c in codes):
            break
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        now = time.monotonic()
        if failed_at is not None and now - failed_at > _GRACE_AFTER_FAILURE_S:
            break  # peers of a failed rank are usually stuck in a collective
        if now > deadline:
            pending = [r.rank for r, c in zip(ranks, codes, strict=True) if c is None]
            logs = "\n".join(f"--- rank {r.rank} ---\n{r.tail(1500)}" for r in ranks)
            _kill_tree(ranks)
            raise RanksTimeoutError(
                f"ranks {pending} still running after {timeout_s:.0f}s; killed all.\n{logs}"
            )
        time.sleep(0.02)
    bad = [r for r in ranks if r.proc.poll() not in (0, None) or not r.result_path.exists()]
    if bad:
        first = min(bad, key=lambda r: r.rank)
        detail = "\n".join(f"--- rank {r.rank} (exit {r.proc.poll()}) ---\n{r.tail()}" for r in bad)
        raise RankFailedError(f"rank {first.rank} failed:\n{detail}")


def _read_result(r: RankProcess) -> Any:
    payload = json.loads(r.result_path.read_text())
    return payload["result"]
