"""The observer process: one per rank, a CPU process outside the trainer that names hangs.

Contract: spawned (never forked) in its own session, it dies with its trainer and reads
nothing of the trainer but its progress record. This module runs its three parts and is
also the store host's entry point. Docs: docs/observer.md, "The observer process".
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

from scout_core.observer.diagnosis_round import DiagnosisRound
from scout_core.observer.progress import PID, STATE, ObserverState, ProgressRecord
from scout_core.observer.rendezvous import Rendezvous
from scout_core.observer.spawn import die_with_parent, read_spec_fd
from scout_core.observer.spec import ObserverSpec
from scout_core.observer.store_host import serve
from scout_core.observer.watch import SilenceWatch

__all__ = ["Observer", "main", "run"]


class Observer(Rendezvous, SilenceWatch, DiagnosisRound):
    """One rank's observer: the watch loop (main thread) and the round listener (a thread)."""


def observe(fd: int) -> int:
    """One rank's observer, told its spec through descriptor ``fd``."""
    spec = ObserverSpec.from_json(read_spec_fd(fd))
    die_with_parent(spec.trainer_pid)
    mem, ev_r, ev_w, _control = spec.fds
    record = ProgressRecord.attach(mem, ev_r, ev_w)
    record.set_observer_word(PID, os.getpid())
    observer = Observer(spec, record)
    observer.join()
    if record.observer_word(STATE) == ObserverState.FAILED:
        return 1
    threading.Thread(
        target=observer.listen_for_rounds, name="scout-round-listener", daemon=True
    ).start()
    observer.watch()
    observer.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m scout_core.observer observe|store <spec fd>``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("observe", "store"):
        print("usage: python -m scout_core.observer observe|store <spec fd>", file=sys.stderr)
        return 2
    if args[0] == "store":
        return serve(int(args[1]))
    return observe(int(args[1]))


def run() -> None:
    """Run :func:`main` and exit without joining the round listener thread."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the round listener thread sits in a blocking store call: do not join it
