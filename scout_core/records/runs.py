"""Run identity and the on-disk layout of runs: one directory per run under ``report_dir``.

Contract: each run writes into ``<report_dir>/<run dir>/`` (:func:`run_directory`); the run
id is ``Config.run_id``, else torchrun's ``TORCHELASTIC_RUN_ID`` (not ``"none"``), else a
fresh ``scout-<UTC date>-<UTC time>-<12 hex digits>`` agreed in one ``MAX`` reduction of
clocks and nonces (:func:`agree_run_id`), so two jobs in one directory never share a file.
Docs: docs/evidence.md, "Who writes what".
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping

import torch.distributed as dist

from scout_core.config import Config
from scout_core.decision.agreement import digest, reduce_max
from scout_core.errors import ConfigError

__all__ = ["agree_run_id", "new_run_id", "run_directory"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def run_directory(run_id: str) -> str:
    """The directory name that holds run ``run_id``'s rank files (a safe file name)."""
    name = _UNSAFE.sub("_", run_id)[:128]
    if not name or name.startswith("."):
        name = f"run-{name}"[:128]
    return name


def new_run_id(seconds: int, nonce: int) -> str:
    """A run id from a UTC time and a nonce: ``scout-20260412-173836-0123456789ab``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(seconds))
    return f"scout-{stamp}-{nonce & ((1 << 48) - 1):012x}"


def agree_run_id(
    config: Config, group: dist.ProcessGroup, *, environ: Mapping[str, str] | None = None
) -> str:
    """The run id of this launch, the same on every rank (module doc). Collective over
    ``group`` (the whole job) on every branch; ranks configured with different run ids get
    a :class:`ConfigError` naming the key, on every rank."""
    named = config.named_run_id(environ)
    mark = digest(named)
    seconds, nonce, hi, neg_lo = reduce_max(
        [int(time.time()), secrets.randbits(62), mark, -mark], group
    )
    if hi != -neg_lo:
        raise ConfigError(
            f"key 'run_id' differs across ranks (this rank: {named!r}); every rank of a "
            "job must use the same run id (or leave it unset)"
        )
    return named if named else new_run_id(seconds, nonce)
