"""The culprit in torchrun's "Root Cause": torchelastic's error file, written at terminate.

With ``on_hang`` (or ``on_sdc``) ``= "terminate"`` every trainer exits. torchrun's agent
prints the oldest failed worker's error file as the job's *Root Cause*; without one it
prints ``error_file: <N/A>`` and a bare exit code, and the person on call learns nothing.
So the trainer logs the verdicts and writes them into that file in torchelastic's format
(``{"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``),
atomically, so the agent never reads half a file. Outside torchelastic nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from scout_core.records.console import attribution_line
from scout_core.records.record import Record

__all__ = ["ERROR_FILE_ENV", "terminate_message", "write_error_file"]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""The variable torchelastic sets on each worker: where the worker's error goes."""

log = logging.getLogger(__name__)


def terminate_message(
    verdicts: Sequence[Record], rank: int, exit_code: int, why: str = "on_hang=terminate"
) -> str:
    """What a terminating trainer says: who SCOUT named, and why this rank exits."""
    lines = [line for v in verdicts if (line := attribution_line(v, rank)) is not None]
    named = "; ".join(lines) or "no culprit was localized"
    return f"SCOUT terminated the job ({why}, exit code {exit_code}): {named}"


def write_error_file(
    verdicts: Sequence[Record],
    rank: int,
    exit_code: int,
    env: Mapping[str, str] | None = None,
    *,
    why: str = "on_hang=terminate",
) -> Path | None:
    """Log the terminate message at ERROR and write torchelastic's error file, if one is set.

    Returns the file written, or ``None`` (outside torchelastic, or on a logged failure)."""
    message = terminate_message(verdicts, rank, exit_code, why)
    log.error("%s", message)
    target = (os.environ if env is None else env).get(ERROR_FILE_ENV)
    if not target:
        return None
    path = Path(target)
    details = "\n".join(
        json.dumps(v.to_dict(), sort_keys=True, separators=(",", ":")) for v in verdicts
    )
    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": f"{message}\nSCOUT evidence records:\n{details}\n",
                "timestamp": str(int(time.time())),
            },
        }
    }
    tmp = path.with_name(f".{path.name}.scout-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.error("could not write %s=%s: %s", ERROR_FILE_ENV, target, exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return None
    return path
