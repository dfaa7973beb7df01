"""Which DeepSpeed checkpoint tags the gate vouches for: the ledger and its JSON sidecar.

The core's gate (:mod:`scout_core.decision.gate`) certifies *generations named by step*.
Under DeepSpeed the checkpoints are the tags the user writes with
``engine.save_checkpoint(save_dir, tag)`` at steps of their choosing, so this
module keeps one :class:`TagEntry` per saved tag and moves its ``role`` as the
gate's cycles complete (:class:`Ledger`), and mirrors the entries of each
directory into ``<save_dir>/scout-certification.json`` (:func:`write_sidecar`,
atomic: temp file, fsync, rename, fsync the directory), so that a fresh process
knows which tag to resume from.

[Roles]
* ``latest``: saved after a clean boundary, its cycle still open;
* ``candidate``: saved exactly when a recipe cycle closed clean, or an older
  ``latest`` whose cycle then closed clean;
* ``verified``: a candidate that survived one more full clean cycle (Algorithm 3's
  promotion; two consecutive clean cycles around the tag);
* ``uncertified``: a boundary in its cycle was inconclusive or missing, or training
  jumped to another tag, so the run of clean cycles around it is broken; never
  promoted, still selectable as ``latest`` after a straggler;
* ``suspect``: saved after the last verified tag when replay found SDC (or newer than
  the verified tag training rolled back to); SCOUT never selects it.

A tag saved at a step where the cycle did not close exactly becomes a candidate only
when the *next* cycle closes, so it is verified one full clean cycle after the cycle
that contains it: never earlier than Algorithm 3 would promote the in-memory
generation captured at the same cycle's close.

The ledger is pure data, identical on every rank (every rank applies the same
job-wide gate decisions); only the rank DeepSpeed itself writes ``latest`` with
writes the sidecar.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scout_core.checkpoint.dcp_io import read_json, write_json
from scout_core.errors import CheckpointError

__all__ = [
    "ROLES",
    "SELECTABLE_AS_LATEST",
    "SIDECAR",
    "SIDECAR_SCHEMA",
    "Ledger",
    "TagEntry",
    "read_sidecar",
    "write_sidecar",
]

SIDECAR = "scout-certification.json"
"""File name of the certification sidecar inside a DeepSpeed ``save_dir``."""
SIDECAR_SCHEMA = "scout.deepspeed.certification/1"

ROLES = ("latest", "candidate", "verified", "uncertified", "suspect")
SELECTABLE_AS_LATEST = frozenset({"latest", "candidate", "verified", "uncertified"})
"""Roles a ``latest`` retrieval (after a straggler) may pick; ``suspect`` never."""


@dataclass(frozen=True, slots=True)
class TagEntry:
    """One saved DeepSpeed tag and what the gate says about it."""

    save_dir: str
    tag: str
    step: int
    """SCOUT's iteration whose update the tag holds (``-1``: saved before any step)."""
    global_steps: int
    """``engine.global_steps`` when it was saved (DeepSpeed's own counter)."""
    role: str
    reason: str
    seq: int
    """Save order within the ledger (later saves win ties on ``step``)."""
    time: float

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise CheckpointError(f"unknown certification role {self.role!r}; known: {ROLES}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["save_dir"]  # the sidecar lives in it; a moved directory stays valid
        return out


def _key(save_dir: str | Path, tag: str) -> tuple[str, str]:
    return (str(Path(save_dir).resolve()), str(tag))


class Ledger:
    """Every tag this job knows of, by ``(resolved save_dir, tag)``."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], TagEntry] = {}
        self._seq = 0

    def get(self, save_dir: str | Path, tag: str) -> TagEntry | None:
        return self.entries.get(_key(save_dir, tag))

    def add(
        self,
        save_dir: str | Path,
        tag: str,
        *,
        step: int,
        global_steps: int,
        role: str,
        reason: str,
    ) -> TagEntry:
        """Record a saved tag (a re-saved tag name replaces its old entry)."""
        self._seq += 1
        key = _key(save_dir, tag)
        entry = TagEntry(key[0], key[1], step, global_steps, role, reason, self._seq, time.time())
        self.entries[key] = entry
        return entry

    def merge(self, save_dir: str | Path, found: Iterable[TagEntry]) -> None:
        """Adopt a sidecar's entries for ``save_dir`` that the ledger does not hold yet."""
        for entry in found:
            key = _key(save_dir, entry.tag)
            if key not in self.entries:
                self._seq = max(self._seq, entry.seq)
                self.entries[key] = replace(entry, save_dir=key[0])

    def set_role(self, entries: Iterable[TagEntry], role: str, reason: str) -> list[TagEntry]:
        """Move ``entries`` to ``role``; returns the updated entries."""
        out = []
        for entry in entries:
            new = replace(entry, role=role, reason=reason)
            self.entries[_key(entry.save_dir, entry.tag)] = new
            out.append(new)
        return out

    def with_role(self, *roles: str) -> list[TagEntry]:
        return sorted((e for e in self.entries.values() if e.role in roles), key=_order)

    def newest(
        self, roles: Iterable[str], *, save_dir: str | Path | None = None
    ) -> TagEntry | None:
        """The newest entry (by step, then save order) with one of ``roles``."""
        wanted = set(roles)
        where = None if save_dir is None else str(Path(save_dir).resolve())
        found = [
            e
            for e in self.entries.values()
            if e.role in wanted and (where is None or e.save_dir == where)
        ]
        return max(found, key=_order, default=None)

    def dirs(self, entries: Iterable[TagEntry]) -> set[str]:
        return {e.save_dir for e in entries}

    def in_dir(self, save_dir: str | Path) -> list[TagEntry]:
        where = str(Path(save_dir).resolve())
        return sorted((e for e in self.entries.values() if e.save_dir == where), key=_order)


def _order(e: TagEntry) -> tuple[int, int]:
    return (e.step, e.seq)


def write_sidecar(
    save_dir: str | Path, entries: Iterable[TagEntry], *, run_id: str, catalog_size: int
) -> Path:
    """Write ``<save_dir>/scout-certification.json`` atomically; returns its path."""
    path = Path(save_dir) / SIDECAR
    data = {
        "schema": SIDECAR_SCHEMA,
        "run_id": run_id,
        "K": catalog_size,
        "tags": [e.to_json() for e in sorted(entries, key=_order)],
    }
    write_json(path, data)
    return path


def read_sidecar(save_dir: str | Path) -> list[TagEntry] | None:
    """The entries of ``save_dir``'s sidecar; None when there is none.

    A corrupt, truncated or foreign sidecar raises :class:`CheckpointError`: it is
    never silently ignored, because it decides which tag a resume trusts.
    """
    path = Path(save_dir) / SIDECAR
    if not path.exists():
        return None
    data = read_json(path, "certification sidecar")
    if not isinstance(data, dict) or data.get("schema") != SIDECAR_SCHEMA:
        raise CheckpointError(f"{path} is not a {SIDECAR_SCHEMA} sidecar")
    where = str(Path(save_dir).resolve())
    out: list[TagEntry] = []
    try:
        for raw in data["tags"]:
            out.append(
                TagEntry(
                    save_dir=where,
                    tag=str(raw["tag"]),
                    step=int(raw["step"]),
                    global_steps=int(raw["global_steps"]),
                    role=str(raw["role"]),
                    reason=str(raw["reason"]),
                    seq=int(raw["seq"]),
                    time=float(raw["time"]),
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: malformed tag entry ({exc!r})") from None
    return out
