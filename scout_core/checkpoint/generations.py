"""The on-disk layout of durable generations: names, manifests, and the scan.

Contract: generation ``step`` lives in ``<checkpoint_dir>/step-NNNNNNNN`` with one
``rank-NNNNN`` directory per rank and a ``manifest.json`` written last; :func:`scan` lists
the committed ones and refuses one it cannot trust. Writing and loading: :mod:`.durable`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from scout_core.checkpoint.dcp_io import read_json
from scout_core.checkpoint.validate import check_int, inside
from scout_core.errors import CheckpointError

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "PREFIX",
    "ROLES",
    "SHARD",
    "SHARD_FORMAT",
    "TMP_PREFIX",
    "TRASH_PREFIX",
    "Generation",
    "generation_name",
    "generation_step",
    "read_manifest",
    "rank_dir",
    "scan",
    "sha256_of",
]

MANIFEST_FORMAT = "scout.generation/1"
SHARD_FORMAT = "scout.shard/1"
ROLES: tuple[str, ...] = ("candidate", "verified", "saved")
"""``candidate`` / ``verified``: the in-memory gate's; ``saved``: written through
:class:`~scout_core.checkpoint.dcp_store.DcpCheckpointIO` (role in the certification sidecar)."""
MANIFEST = "manifest.json"
SHARD = "shard.json"
PREFIX = "step-"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"


@dataclass(frozen=True)
class Generation:
    """A committed generation as its manifest describes it."""

    step: int
    role: str
    run_id: str
    world_size: int
    path: Path
    shards: Mapping[str, str]
    """Global rank (as str) → sha256 of that rank's ``shard.json``."""
    nbytes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Global rank (as str) → tensor bytes of that rank's shard (empty in manifests
    written before it was recorded): the bound every size field is checked against."""


# -- small file-system helpers -------------------------------------------------------


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def generation_name(step: int) -> str:
    """The directory name of generation ``step`` (``step-00000012``)."""
    return f"{PREFIX}{step:08d}"


def generation_step(name: str) -> int | None:
    """The step a generation directory name stands for; None for any other name."""
    digits = name[len(PREFIX) :]
    if not name.startswith(PREFIX) or len(digits) != 8 or not digits.isdigit():
        return None
    return int(digits)


def rank_dir(gen: Path, rank: int) -> Path:
    """Where rank ``rank``'s shard of generation ``gen`` lives."""
    return gen / f"rank-{rank:05d}"


# -- scanning ----------------------------------------------------------------------------


def read_manifest(gen: Path) -> Generation:
    """A committed generation's manifest, every field type-checked (:mod:`.validate`)."""
    where = gen / MANIFEST
    data = read_json(where, "manifest")
    if not isinstance(data, dict):
        raise CheckpointError(f"manifest {where} is not an object")
    if data.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"manifest {where} has unknown format {data.get('format')!r:.60}")
    role = data.get("role")
    if role not in ROLES:
        raise CheckpointError(f"manifest {where} has unknown role {role!r:.60}")
    step = check_int(data.get("step"), f"manifest {where}: step", high=99_999_999)
    world = check_int(data.get("world_size"), f"manifest {where}: world_size", low=1)
    run_id, shards, nbytes = data.get("run_id"), data.get("shards"), data.get("nbytes", {})
    if not isinstance(run_id, str) or not isinstance(shards, dict) or not isinstance(nbytes, dict):
        raise CheckpointError(f"manifest {where} is malformed (run_id, shards, nbytes)")
    if gen.name != generation_name(step):
        raise CheckpointError(f"manifest {where} names step {step}, dir is {gen.name}")
    if set(shards) != {str(r) for r in range(world)} or not all(
        isinstance(v, str) for v in shards.values()
    ):
        raise CheckpointError(
            f"manifest {where} lists shards {sorted(shards)!r:.80} for {world} ranks"
        )
    totals = {
        str(k): check_int(v, f"manifest {where}: nbytes of rank {k}") for k, v in nbytes.items()
    }
    return Generation(step, role, run_id, world, gen, dict(shards), totals)


def scan(checkpoint_dir: str | os.PathLike[str]) -> list[Generation]:
    """Every committed generation under ``checkpoint_dir``, oldest first; a committed dir
    whose manifest is missing or corrupt raises :class:`CheckpointError` (its role is unknown)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    gens = [
        read_manifest(inside(p, root, "generation directory"))
        for p in sorted(root.iterdir())
        if p.is_dir() and p.name.startswith(PREFIX)
    ]
    return sorted(gens, key=lambda g: g.step)
