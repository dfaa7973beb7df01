"""Which framework checkpoint tags the gate vouches for: the ledger and its JSON sidecar.

Contract: :class:`Ledger` keeps one :class:`TagEntry` per saved tag and moves its role as
the gate's cycles complete; it is pure data, identical on every rank, and framework-free.
:func:`write_sidecar` mirrors a directory's entries into its sidecar atomically (only the
rank that writes the framework's "latest" marker); ``scout.deepspeed.certification/1``
sidecars are still read. Docs: docs/checkpoint_gate.md, "Checkpoints the framework owns".
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scout_core.checkpoint.dcp_io import read_json, write_json
from scout_core.checkpoint.validate import check_int, plain_name
from scout_core.errors import CheckpointError

__all__ = [
    "MAX_ENTRIES",
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
SIDECAR_SCHEMA = "scout.certification/1"
_LEGACY_SCHEMAS = frozenset({SIDECAR_SCHEMA, "scout.deepspeed.certification/1"})

ROLES = ("latest", "candidate", "verified", "uncertified", "suspect")
SELECTABLE_AS_LATEST = frozenset({"latest", "candidate", "verified", "uncertified"})
"""Roles a ``latest`` retrieval (after a straggler) may pick; ``suspect`` never."""
_SELECTABLE_FIRST = frozenset({"latest", "candidate", "verified"})

MAX_ENTRIES = 1024
"""Tags the ledger keeps per directory (a run saving every few minutes for months must
not grow it, or its sidecar, without bound); frameworks prune their own old tags."""


@dataclass(frozen=True, slots=True)
class TagEntry:
    """One saved framework tag and what the gate says about it."""

    directory: str
    tag: str
    step: int
    """SCOUT's iteration whose update the tag holds (``-1``: saved before any step)."""
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
        del out["directory"]  # the sidecar lives in it; a moved directory stays valid
        return out


def _key(directory: str | Path, tag: str) -> tuple[str, str]:
    return (str(Path(directory).resolve()), str(tag))


class Ledger:
    """Every tag this job knows of, by ``(resolved directory, tag)``."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], TagEntry] = {}
        self._seq = 0

    def get(self, directory: str | Path, tag: str) -> TagEntry | None:
        return self.entries.get(_key(directory, tag))

    def add(
        self,
        directory: str | Path,
        tag: str,
        *,
        step: int,
        role: str,
        reason: str,
    ) -> TagEntry:
        """Record a saved tag (a re-saved tag name replaces its old entry)."""
        self._seq += 1
        key = _key(directory, tag)
        entry = TagEntry(key[0], key[1], step, role, reason, self._seq, time.time())
        self.entries[key] = entry
        self._bound(key[0])
        return entry

    def _bound(self, where: str) -> None:
        """At most :data:`MAX_ENTRIES` per directory: oldest first, unselectable roles before
        the others; the newest ``verified`` tag always stays."""
        held = [e for e in self.entries.values() if e.directory == where]
        if len(held) <= MAX_ENTRIES:
            return
        keep = max((e for e in held if e.role == "verified"), key=_order, default=None)
        order = sorted(held, key=lambda e: (e.role in _SELECTABLE_FIRST, _order(e)))
        for e in order[: len(held) - MAX_ENTRIES]:
            if e is not keep:
                del self.entries[_key(e.directory, e.tag)]

    def merge(self, directory: str | Path, found: Iterable[TagEntry]) -> None:
        """Adopt a sidecar's entries for ``directory`` that the ledger does not hold yet."""
        for entry in found:
            key = _key(directory, entry.tag)
            if key not in self.entries:
                self._seq = max(self._seq, entry.seq)
                self.entries[key] = replace(entry, directory=key[0])

    def set_role(self, entries: Iterable[TagEntry], role: str, reason: str) -> list[TagEntry]:
        """Move ``entries`` to ``role``; returns the updated entries."""
        out = []
        for entry in entries:
            new = replace(entry, role=role, reason=reason)
            self.entries[_key(entry.directory, entry.tag)] = new
            out.append(new)
        return out

    def with_role(self, *roles: str) -> list[TagEntry]:
        return sorted((e for e in self.entries.values() if e.role in roles), key=_order)

    def newest(
        self, roles: Iterable[str], *, directory: str | Path | None = None
    ) -> TagEntry | None:
        """The newest entry (by step, then save order) with one of ``roles``."""
        wanted = set(roles)
        where = None if directory is None else str(Path(directory).resolve())
        found = [
            e
            for e in self.entries.values()
            if e.role in wanted and (where is None or e.directory == where)
        ]
        return max(found, key=_order, default=None)

    def dirs(self, entries: Iterable[TagEntry]) -> set[str]:
        return {e.directory for e in entries}

    def in_dir(self, directory: str | Path) -> list[TagEntry]:
        where = str(Path(directory).resolve())
        return sorted((e for e in self.entries.values() if e.directory == where), key=_order)


def _order(e: TagEntry) -> tuple[int, int]:
    return (e.step, e.seq)


def write_sidecar(
    directory: str | Path, entries: Iterable[TagEntry], *, run_id: str, catalog_size: int
) -> Path:
    """Write ``<directory>/scout-certification.json`` atomically; returns its path."""
    path = Path(directory) / SIDECAR
    data = {
        "schema": SIDECAR_SCHEMA,
        "run_id": run_id,
        "K": catalog_size,
        "tags": [e.to_json() for e in sorted(entries, key=_order)],
    }
    write_json(path, data)
    return path


def read_sidecar(directory: str | Path) -> list[TagEntry] | None:
    """``directory``'s sidecar entries, or None; a corrupt, truncated or foreign one raises
    :class:`CheckpointError`, never ignored: it decides which tag a resume trusts."""
    path = Path(directory) / SIDECAR
    if not path.exists():
        return None
    data = read_json(path, "certification sidecar")
    if not isinstance(data, dict) or data.get("schema") not in _LEGACY_SCHEMAS:
        raise CheckpointError(f"{path} is not a {SIDECAR_SCHEMA} sidecar")
    where = str(Path(directory).resolve())
    tags = data.get("tags")
    if not isinstance(tags, list) or len(tags) > 4 * MAX_ENTRIES:
        raise CheckpointError(f"{path}: 'tags' must be a list of at most {4 * MAX_ENTRIES}")
    out: list[TagEntry] = []
    for i, raw in enumerate(tags):
        what = f"{path}: tag entry {i}"
        if not isinstance(raw, dict):
            raise CheckpointError(f"{what} is not an object")
        when, role, reason = raw.get("time"), raw.get("role"), raw.get("reason")
        if (
            isinstance(when, bool)
            or not isinstance(when, int | float)
            or not math.isfinite(when)
            or not isinstance(role, str)
            or not isinstance(reason, str)
        ):
            raise CheckpointError(f"{what} is malformed (time, role, reason)")
        out.append(
            TagEntry(
                directory=where,
                tag=plain_name(raw.get("tag"), f"{what}: tag"),  # a tag never leaves the dir
                step=check_int(raw.get("step"), f"{what}: step", low=-1),
                role=role,
                reason=reason[:1000],
                seq=check_int(raw.get("seq"), f"{what}: seq"),
                time=float(when),
            )
        )
    return out
