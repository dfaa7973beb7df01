"""Run identity and the on-disk layout of runs: one directory per run under ``report_dir``.

Every record carries a ``run_id``, and two jobs started in the same working directory
must never write into one file. So each run gets its own directory,
``<report_dir>/<run dir>/rank-<r>.jsonl`` (:func:`run_directory`: the run id itself,
with any character a file name should not hold replaced), and the run id is unique
per launch unless the user names the run:

1. ``Config.run_id`` when set (the user's name for the run);
2. else ``TORCHELASTIC_RUN_ID`` when torchrun was given one (``--rdzv-id``); plain
   ``torchrun`` sets it to ``"none"``, which is no identity at all and is ignored;
3. else a fresh id, ``scout-<UTC date>-<UTC time>-<12 hex digits>``, agreed by every
   rank: each contributes its clock and a random nonce to one ``MAX`` reduction on a
   diagnostic group (:func:`agree_run_id`), so all ranks get the same id without rank 0
   having to speak first.

``scout report`` reads both layouts: rank files directly in the directory it is given
(reports written before runs had directories, or a run directory itself) and rank files
in its immediate subdirectories (one per run); see :mod:`.reading`.
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
    ``group`` (a diagnostic group over the whole job), whichever branch is taken, so
    that every rank runs the same collectives. Ranks configured with different run ids
    get a :class:`ConfigError` naming the key, on every rank."""
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
