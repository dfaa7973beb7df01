"""SCOUT's own storage: writability checked at ``enable``, and what counts as a storage fault.

Contract: :func:`check_storage` fails ``enable`` on every rank when any rank cannot write
(before training starts); at run time a local failure is caught as one of
:data:`STORAGE_ERRORS` and reported into the agreement that follows it. Docs:
docs/checkpoint_gate.md, "When SCOUT's own storage fails".
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from scout_core.config import Config
from scout_core.decision.agreement import reduce_max
from scout_core.errors import ConfigError
from scout_core.records.runs import run_directory

__all__ = ["STORAGE_ERRORS", "check_storage", "describe", "probe_writable"]

STORAGE_ERRORS: tuple[type[BaseException], ...] = (Exception, CheckpointException)
"""What a local write may raise: any ``Exception`` (``OSError`` for a full or read-only
disk) and DCP's ``CheckpointException``, a ``BaseException``. ``KeyboardInterrupt`` and
``SystemExit`` are not storage faults and propagate."""

_NOBODY = 1 << 62


def describe(exc: BaseException) -> str:
    """One line for a storage error: ``OSError``'s text, DCP's ``CheckpointException`` by
    the errors it wraps, else ``Type: message``."""
    if isinstance(exc, CheckpointException):
        causes = {describe(cause) for cause, _ in exc.failures.values()}
        return "DCP: " + "; ".join(sorted(causes)) if causes else "DCP CheckpointException"
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def error_code(exc: BaseException) -> int:
    """The ``errno`` behind a storage error (DCP's ``CheckpointException`` by the first
    wrapped error that has one); 0 when there is none."""
    if isinstance(exc, CheckpointException):
        codes = [error_code(cause) for cause, _ in exc.failures.values()]
        return next((c for c in codes if c), 0)
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno
    return 0


def probe_writable(directory: str | os.PathLike[str]) -> str | None:
    """Create ``directory`` if needed and write, fsync and remove a probe file in it;
    None when that worked, else why not."""
    path = Path(directory)
    probe = path / f".scout-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"scout probe\n" * 64)
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        return describe(exc)
    return None


def check_storage(config: Config, group: dist.ProcessGroup) -> None:
    """Probe ``report_dir`` (this run's directory in it) and ``checkpoint_dir``, agree
    job-wide, and raise :class:`ConfigError` on every rank when any failed. Collective over
    ``group`` (the whole job); ``config`` must carry the agreed run id."""
    run = config.resolved_run_id()
    checks = [("report_dir", config.report_dir, Path(config.report_dir) / run_directory(run))]
    if config.checkpoint_dir is not None:
        checks.append(("checkpoint_dir", config.checkpoint_dir, Path(config.checkpoint_dir)))
    rank = dist.get_rank()
    local = [probe_writable(target) for _, _, target in checks]
    words: list[int] = []
    for why in local:  # per key: any failed, the highest and the lowest failing rank
        failed = why is not None
        words += [int(failed), rank if failed else -1, -rank if failed else -_NOBODY]
    found = reduce_max(words, group)
    problems = []
    for i, (key, value, _) in enumerate(checks):
        any_failed, hi, neg_lo = found[3 * i : 3 * i + 3]
        if not any_failed:
            continue
        lo = -neg_lo
        ranks = f"rank {lo}" if lo == hi else f"some ranks (lowest {lo}, highest {hi})"
        mine = f"; this rank: {local[i]}" if local[i] is not None else ""
        problems.append(f"key {key!r}: {value!r} is not writable on {ranks}{mine}")
    if problems:
        raise ConfigError(
            "SCOUT cannot write its own files, so it refuses to start (every rank stops "
            "here): " + "; ".join(problems)
        )
