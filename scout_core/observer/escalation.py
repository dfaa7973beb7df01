"""What happens after a hang verdict: evidence, the user's callback, an optional action.

Contract: verdicts reach every member's trainer as JSON lines on a pipe (never pickle),
where a background thread passes them to the user's callback; ``Config.on_hang`` picks the
action on a localized verdict. :func:`check_watchdog` refuses timeouts that would let the
communicator's own watchdog speak first. Docs: docs/observer.md, "Escalation".
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scout_core.config import Config
from scout_core.errors import ConfigError
from scout_core.observer.elastic_error import write_error_file
from scout_core.observer.verdict import Verdict
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Mode

if TYPE_CHECKING:
    from scout_core.observer.core import ObserverBase

__all__ = [
    "STACK_SIGNAL",
    "TERMINATE_GRACE_S",
    "TERMINATE_SPREAD_S",
    "VERDICT_MARGIN_S",
    "ControlListener",
    "check_watchdog",
    "communicator_timeout",
    "escalate",
    "install_stack_dump",
    "send_command",
    "terminate_trainer",
    "to_record",
]

STACK_SIGNAL: int = int(signal.SIGRTMIN) + 5
"""Signal the observer sends to dump the trainer's stacks (a real-time signal that
launchers and frameworks do not use, unlike SIGUSR1/SIGUSR2)."""
TERMINATE_GRACE_S = 2.0
"""Seconds a trainer gets to exit by itself before its observer kills it."""
TERMINATE_SPREAD_S = 0.5
"""Seconds a trainer waits between its terminate command and its exit (shorter than
:data:`TERMINATE_GRACE_S`): exiting at once would close its sockets under peers still in
the collective, whose communicator would raise (exit code 1) before their own command."""
VERDICT_MARGIN_S = 5.0
"""Seconds a diagnosis round needs beyond the hang timeout (rendezvous, AllGather, records)."""


def escalate(observer: ObserverBase, decided: Sequence[tuple[Verdict, int]]) -> None:
    """Write, hand over and act on the job's verdicts of one round.

    ``decided`` pairs each verdict with the rank whose observer writes its record (once for
    the job). Every observer hands every verdict to its trainer and acts on localized ones."""
    s = observer.spec
    control = s.fds[3]
    for v, writer in decided:
        group = v.group or s.peers
        hosts = {r: observer.host_of(r) for r in v.outliers}
        record = to_record(v, run_id=s.run_id, group=group, hosts=hosts)
        if s.rank == writer:
            observer.writer.write(record)
        send_command(control, {"verdict": record.to_dict()})
    localized = [v for v, _ in decided if v.localized]
    if not localized:
        return
    if s.on_hang == "dump_stacks" and any(s.rank in v.outliers for v in localized):
        with contextlib.suppress(ProcessLookupError):
            os.kill(s.trainer_pid, STACK_SIGNAL)
    elif s.on_hang == "terminate":
        terminate_trainer(control, s.trainer_pid, s.hang_exit_code)


def to_record(
    verdict: Verdict,
    *,
    run_id: str,
    group: Sequence[int],
    hosts: Mapping[int, str],
) -> Record:
    """The evidence record of one verdict."""
    return Record(
        schema=VERDICT_SCHEMA,
        run_id=run_id,
        step=verdict.step,
        surface=verdict.surface,
        mode=Mode.EXACT,
        status=verdict.status,
        failure=verdict.failure,
        group=tuple(group),
        outliers=verdict.outliers,
        scope=verdict.scope,
        hosts=tuple(hosts.get(r, "") for r in verdict.outliers),
        detail=verdict.detail,
    )


def send_command(fd: int, message: Mapping[str, Any]) -> None:
    """One JSON line to the trainer's control pipe; a gone trainer is not an error."""
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except (BrokenPipeError, OSError):
        pass


def terminate_trainer(fd: int, trainer_pid: int, exit_code: int) -> None:
    """Ask the trainer to exit with ``exit_code``; kill it if it cannot."""
    send_command(fd, {"terminate": exit_code})
    deadline = time.monotonic() + TERMINATE_GRACE_S
    while time.monotonic() < deadline:
        if not _alive(trainer_pid):
            return
        time.sleep(0.05)
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(trainer_pid, sig)
        except ProcessLookupError:
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def install_stack_dump(report_dir: str, rank: int) -> Callable[[], None]:
    """Register faulthandler on :data:`STACK_SIGNAL`; return the undo."""
    path = Path(report_dir) / f"stacks-rank-{rank}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    out: IO[str] = open(path, "a")  # noqa: SIM115 - faulthandler needs it open for life
    faulthandler.register(STACK_SIGNAL, file=out, all_threads=True, chain=False)

    def undo() -> None:
        faulthandler.unregister(STACK_SIGNAL)
        out.close()

    return undo


class ControlListener:
    """The trainer's thread reading its observer's pipe: callbacks and terminate.

    ``verdicts`` collects every record handed over (shared across a restarted observer's
    listeners); ``on_exit`` runs on this thread when the observer process exits."""

    def __init__(
        self,
        fd: int,
        callbacks: Sequence[Callable[[Record], None]],
        verdicts: list[Record] | None = None,
        *,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self._fd = fd
        self._callbacks = list(callbacks)
        self.verdicts: list[Record] = [] if verdicts is None else verdicts
        self._on_exit = on_exit
        self._thread = threading.Thread(
            target=self._run, name="scout-observer-control", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                return
            if not chunk:  # the observer exited
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = -1
                if self._on_exit is not None:
                    self._on_exit()
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._handle(json.loads(line))

    def _handle(self, message: Mapping[str, Any]) -> None:
        if "terminate" in message:
            code = int(message["terminate"])
            # To the console and torchelastic's error file, so "Root Cause" names the culprit.
            rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
            write_error_file([v for v in self.verdicts if v.outliers][-8:], rank, code)
            sys.stdout.flush()
            sys.stderr.flush()
            time.sleep(TERMINATE_SPREAD_S)  # let the other members' commands arrive
            os._exit(code)
        if "verdict" in message:
            record = Record.from_dict(message["verdict"])
            self.verdicts.append(record)
            for cb in self._callbacks:
                try:
                    cb(record)
                except Exception as exc:  # a user callback must not kill the listener
                    print(f"scout: hang callback raised {exc!r}", file=sys.stderr)

    def join(self, timeout_s: float) -> None:
        """Wait for the thread (it ends when the observer closes its end), then close."""
        self._thread.join(timeout_s)
        if not self._thread.is_alive() and self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)


def communicator_timeout(group: dist.ProcessGroup | None = None) -> timedelta | None:
    """The shortest collective timeout of ``group``'s backends (default group if None).

    Reads the backend options' private ``_timeout`` (torch has no public accessor), else the
    backend's default; ``None`` without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    found: list[timedelta] = []
    for device in getattr(pg, "_device_types", []) or [torch.device("cpu")]:
        try:
            backend = pg._get_backend(device)
        except RuntimeError:
            continue
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            found.append(timeout)
    if found:
        return min(found)
    default: timedelta = dist.distributed_c10d._get_default_timeout(dist.get_backend(pg))
    return default


def check_watchdog(config: Config, group: dist.ProcessGroup | None = None) -> None:
    """Raise :class:`ConfigError` unless SCOUT's hang verdict comes before the watchdog.

    Requires ``max(hang_timeout_s, stage timeout) + observer_join_timeout_s +
    VERDICT_MARGIN_S`` below the communicator's timeout (default group unless given): a
    round waits up to the join timeout for a silent peer's observer before naming it."""
    if not config.observer:
        return
    timeout = communicator_timeout(group)
    if timeout is None:
        return
    slowest = max(config.hang_timeout_s, config.resolved_stage_timeout_s())
    join = config.observer_join_timeout_s
    need = slowest + join + VERDICT_MARGIN_S
    if need >= timeout.total_seconds():
        key = (
            "hang_timeout_s"
            if config.hang_timeout_s >= config.resolved_stage_timeout_s()
            else "stage_timeout_s"
        )
        room = timeout.total_seconds() - VERDICT_MARGIN_S - join
        raise ConfigError(
            f"{key} = {slowest:g} s leaves no time before the training communicator's "
            f"timeout of {timeout.total_seconds():g} s: the hang verdict needs {key} + "
            f"observer_join_timeout_s ({join:g} s, how long a round waits for a silent "
            f"peer's observer) + {VERDICT_MARGIN_S:g} s < that timeout, or the watchdog "
            f"tears the job down first. Lower {key} below {max(room, 0.0):g} s, lower "
            "observer_join_timeout_s, or raise the process group timeout "
            "(init_process_group(timeout=...))."
        )
