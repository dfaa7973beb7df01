"""A pre-imported parent that forks test ranks (:func:`scout_core.testing.run_ranks`).

Started by the harness with its own environment and the ranks' values of the variables
read while importing (``zygotes.KEY_PREFIXES``). It imports torch, SCOUT's own modules
that a rank enabling SCOUT imports (:data:`SCOUT_MODULES`, with the parts of torch they
pull in: DTensor alone is about 2 CPU-seconds), and ``SCOUT_TEST_PRELOAD``'s modules
once, then forks one child per request, so a rank skips the 5-7 CPU-seconds of those
imports a fresh interpreter pays. A child becomes
a rank exactly as ``_worker.py`` does, in its own session, dying with this process,
which dies with the harness.

Protocol, one JSON object per line: requests on stdin
(``{"spec", "log", "env", "cwd"}``), replies on stdout: ``{"ready", "threads"}`` once,
``{"pid"}`` per request, and ``{"exit", "code"}`` (``Popen.returncode``'s convention)
when a child ends. The zygote must hold a single thread when it forks; it reports its
count and the harness falls back to fresh processes otherwise.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import sys
import traceback
from typing import Any

_worker: Any = importlib.import_module("_worker")  # beside this script, as ranks run it
_helpers: Any = importlib.import_module("_helpers")  # forked observers (its module note)
PRELOAD_ENV = "SCOUT_TEST_PRELOAD"  # zygotes.PRELOAD_ENV: this script imports no package
SCOUT_MODULES = (
    "torch.distributed.tensor",
    "scout_core.config",
    "scout_core.plugin.torch_plugin",
    "scout_core.campaign.torch_setups",
    "scout_core.testing.models",
)
"""What a rank that trains under SCOUT imports anyway, preloaded from the harness's own
copy of ``scout_core`` (the one this script belongs to, whatever ``sys.path`` finds)."""


def _send(replies: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(replies, data) :]


def _become_rank(request: dict[str, Any], zygote_pid: int, replies: int) -> None:
    """In the forked child: the rank's session, files, environment; never returns."""
    code = 1
    try:
        os.setsid()
        _worker._die_with_parent(zygote_pid)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.close(replies)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _helpers.install(os.getpid())  # while this child still holds one thread
        sys.argv = [os.path.join(os.path.dirname(__file__), "_worker.py"), request["spec"]]
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # a fresh process seeds it from the OS; forks share it
            numpy.random.seed()
        code = _worker.main(request["spec"], parent_pid=zygote_pid)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(replies: int) -> None:
    for pid, code in _helpers.reaped():
        _send(replies, {"exit": pid, "code": code})


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1  # unknown: the harness treats it as unsafe


def _preload_scout() -> None:
    """Import :data:`SCOUT_MODULES` from the ``scout_core`` this script is part of; one
    that fails to import is left to the ranks (which then report the error themselves)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    try:
        for name in SCOUT_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # a rank imports it again and fails loudly
                traceback.print_exc()
                return
    finally:
        sys.path.remove(root)  # the first entry: the one inserted above


def main() -> int:
    _worker._die_with_parent(int(sys.argv[1]))
    replies = os.dup(1)  # the pipe to the harness; fd 1 goes where a stray print may land
    os.dup2(2, 1)
    import torch.distributed  # noqa: F401  # the point of a zygote: imported once

    _preload_scout()
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        importlib.import_module(name.strip())
    _send(replies, {"ready": True, "threads": _threads()})
    me = os.getpid()
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.02)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                return 0  # the harness closed the pipe: children die with us
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _become_rank(request, me, replies)
                _send(replies, {"pid": pid})
        _reap(replies)


if __name__ == "__main__":
    sys.exit(main())
