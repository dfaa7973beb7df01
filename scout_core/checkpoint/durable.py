"""Durable gate checkpoints: DCP shards, a JSON manifest per generation, atomic commit.

Candidates and verified checkpoints outlive the process, so recovery after a whole
job restart can still pick the generation the gate trusted. Layout::

    <checkpoint_dir>/
      step-00000004/                 one committed generation
        manifest.json                role, step, run_id, world size, sha256 per shard
        rank-00003/                  one rank's shard, written with DCP
          __0_0.distcp  .metadata    torch.distributed.checkpoint files
          .metadata.json             the same DCP metadata as JSON (what SCOUT reads)
          shard.json                 non-tensor state + sha256 of every file above
      .tmp-step-00000006/            a generation being written: never selected

[Atomic commit]
Every rank writes its shard into the temp dir and fsyncs it; one MIN all-reduce on
a diagnostic Gloo group confirms that *every* shard is complete; only then does the
coordinator (the group's first rank) write ``manifest.json``, fsync, rename the temp
dir to its final name and fsync the parent. The rename is the commit point: a rank
killed mid-write leaves a ``.tmp-*`` dir, which is never selected and is removed by
the next persist. A role change (candidate → verified) rewrites the manifest the same
way (temp file, fsync, rename); a discarded generation is renamed away before it is
deleted, so a half-deleted dir is never mistaken for a generation. Like DCP's own
``FileSystemWriter``, this assumes ``checkpoint_dir`` is one shared file system.

[Nothing is unpickled]
Each rank saves its shard as its own DCP checkpoint (``no_dist=True``), so DCP's
planning collectives, which exchange pickled plans, never run; the job-wide commit
is SCOUT's own tensor all-reduce. DCP's metadata is read back from JSON
(:mod:`.dcp_io`), tensor data with ``torch.load(weights_only=True)``; manifests and
shard descriptions are JSON.

[Loading]
Each rank picks the newest committed generation of the wanted role, checks the
manifest, its own shard's sha256 sums and the run, then the ranks compare their
picks with a collective minimum/maximum *before* anything is applied: a rank
that holds a different generation, or none, fails the load everywhere with a
:class:`~scout_core.errors.CheckpointError`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from scout_core.checkpoint.dcp_io import (
    JsonMetadataReader,
    JsonMetadataWriter,
    fsync_dir,
    per_rank_dcp,
    read_json,
    write_json,
)
from scout_core.checkpoint.state import flatten, tensor_specs, unflatten
from scout_core.decision.agreement import all_ok, check_group, min_max
from scout_core.errors import CheckpointError

__all__ = [
    "MANIFEST_FORMAT",
    "SHARD_FORMAT",
    "ROLES",
    "Generation",
    "DurableStore",
    "generation_name",
    "generation_step",
    "scan",
]

MANIFEST_FORMAT = "scout.generation/1"
SHARD_FORMAT = "scout.shard/1"
ROLES: tuple[str, ...] = ("candidate", "verified", "saved")
"""``candidate`` / ``verified``: the in-memory gate's generations; ``saved``: a checkpoint
written through :class:`~scout_core.checkpoint.dcp_store.DcpCheckpointIO` (its gate role
lives in the certification sidecar)."""
_MANIFEST = "manifest.json"
_SHARD = "shard.json"
_PREFIX = "step-"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


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


# -- small file-system helpers -------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def generation_name(step: int) -> str:
    """The directory name of generation ``step`` (``step-00000012``)."""
    return f"{_PREFIX}{step:08d}"


def generation_step(name: str) -> int | None:
    """The step a generation directory name stands for; None for any other name."""
    digits = name[len(_PREFIX) :]
    if not name.startswith(_PREFIX) or len(digits) != 8 or not digits.isdigit():
        return None
    return int(digits)


def _rank_dir(gen: Path, rank: int) -> Path:
    return gen / f"rank-{rank:05d}"


# -- scanning ----------------------------------------------------------------------------


def _parse_manifest(gen: Path) -> Generation:
    data = read_json(gen / _MANIFEST, "manifest")
    try:
        if data["format"] != MANIFEST_FORMAT:
            raise CheckpointError(
                f"manifest {gen / _MANIFEST} has unknown format {data['format']!r}"
            )
        role = data["role"]
        if role not in ROLES:
            raise CheckpointError(f"manifest {gen / _MANIFEST} has unknown role {role!r}")
        step, world = int(data["step"]), int(data["world_size"])
        shards = {str(k): str(v) for k, v in data["shards"].items()}
        run_id = str(data["run_id"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"manifest {gen / _MANIFEST} is malformed: {exc!r}") from None
    if gen.name != generation_name(step):
        raise CheckpointError(f"manifest {gen / _MANIFEST} names step {step}, dir is {gen.name}")
    if sorted(shards, key=int) != [str(r) for r in range(world)]:
        raise CheckpointError(
            f"manifest {gen / _MANIFEST} lists shards {sorted(shards)} for {world} ranks"
        )
    return Generation(step, role, run_id, world, gen, shards)


def scan(checkpoint_dir: str | os.PathLike[str]) -> list[Generation]:
    """Every committed generation under ``checkpoint_dir``, oldest first.

    Temp and trash dirs are ignored (they were never committed). A committed dir
    whose manifest is missing, corrupt or truncated raises :class:`CheckpointError`:
    its role is unknown, so no choice around it can be trusted silently.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    gens = [
        _parse_manifest(p)
        for p in sorted(root.iterdir())
        if p.is_dir() and p.name.startswith(_PREFIX)
    ]
    return sorted(gens, key=lambda g: g.step)


class DurableStore:
    """Persists, promotes, discards and loads gate generations for one rank.

    Every method that changes or reads the store is collective over ``group``, a
    diagnostic Gloo group over the whole job (never ``WORLD``); ``ranks`` are its
    global ranks and the first one coordinates (writes manifests, renames).
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        *,
        group: dist.ProcessGroup,
        ranks: list[int],
        run_id: str,
    ) -> None:
        self.group = check_group(group)  # a SCOUT diagnostic group, never WORLD
        self.root = Path(checkpoint_dir)
        self.ranks = list(ranks)
        self.rank = dist.get_rank()
        self.run_id = run_id
        self.coordinator = self.rank == self.ranks[0]
        if self.ranks != list(range(len(self.ranks))):
            raise ValueError(
                f"the durable store needs the whole job in rank order, got {self.ranks}"
            )

    # -- collectives ---------------------------------------------------------------------

    def _all_ok(self, ok: bool) -> bool:
        return all_ok(ok, self.group)

    def _min_max(self, value: int) -> tuple[int, int]:
        return min_max(value, self.group)

    # -- writing -------------------------------------------------------------------------

    def _write_shard(self, rank_dir: Path, step: int, tree: Mapping[str, Any]) -> None:
        skeleton, tensors = flatten(tree)
        rank_dir.mkdir(parents=True, exist_ok=True)
        # no_dist: each rank saves its own shard, so DCP's object collectives never run.
        with per_rank_dcp():
            dcp_save(
                {k: t.contiguous() for k, t in tensors.items()},
                storage_writer=JsonMetadataWriter(rank_dir, sync_files=True),
                no_dist=True,
            )
        files = {p.name: _sha256(p) for p in sorted(rank_dir.iterdir()) if p.is_file()}
        shard = {
            "format": SHARD_FORMAT,
            "step": step,
            "rank": self.rank,
            "run_id": self.run_id,
            "skeleton": skeleton,
            "files": files,
        }
        write_json(rank_dir / _SHARD, shard)

    def persist(self, step: int, tree: Mapping[str, Any], *, role: str = "candidate") -> Generation:
        """Write this rank's ``tree`` as generation ``step``; commit atomically, job-wide."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        tmp = self.root / f"{_TMP_PREFIX}{generation_name(step)}"
        final = self.root / generation_name(step)
        if self.coordinator:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.iterdir():  # leftovers of a writer that died
                if stale.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
                    shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        self._all_ok(True)  # everyone waits for the clean temp dir
        error: Exception | None = None
        try:
            self._write_shard(_rank_dir(tmp, self.rank), step, tree)
            fsync_dir(tmp)
        except Exception as exc:  # reported job-wide below, re-raised here
            error = exc
        if not self._all_ok(error is None):
            if self.coordinator:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"persisting step {step} failed on some rank; nothing was committed"
                + (f" (this rank: {error!r})" if error else "")
            ) from error
        committed = True
        if self.coordinator:
            try:
                shards = {str(r): _sha256(_rank_dir(tmp, r) / _SHARD) for r in self.ranks}
                manifest = {
                    "format": MANIFEST_FORMAT,
                    "role": role,
                    "step": step,
                    "run_id": self.run_id,
                    "world_size": len(self.ranks),
                    "shards": shards,
                    "time": time.time(),
                }
                write_json(tmp / _MANIFEST, manifest)
                if final.exists():
                    self._trash(final)
                os.replace(tmp, final)  # the commit point
                fsync_dir(self.root)
            except OSError:
                committed = False
        if not self._all_ok(committed):
            raise CheckpointError(f"committing step {step} failed on the coordinator")
        return _parse_manifest(final)

    def _trash(self, gen: Path) -> None:
        trash = gen.with_name(f"{_TRASH_PREFIX}{gen.name}-{time.monotonic_ns()}")
        os.replace(gen, trash)  # atomic: the generation is gone before it is deleted
        fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def set_role(self, step: int, role: str) -> None:
        """Change generation ``step``'s role (promotion); collective."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        ok = True
        if self.coordinator:
            gen = self.root / generation_name(step)
            try:
                data = read_json(gen / _MANIFEST, "manifest")
                data["role"] = role
                write_json(gen / _MANIFEST, data)
            except (OSError, CheckpointError):
                ok = False
        if not self._all_ok(ok):
            raise CheckpointError(f"could not mark step {step} as {role}")

    def discard(self, step: int) -> None:
        """Remove generation ``step`` (never selected again); collective."""
        if self.coordinator:
            gen = self.root / generation_name(step)
            if gen.exists():
                self._trash(gen)
        self._all_ok(True)

    def discard_except(self, keep: set[int]) -> None:
        """Remove every committed generation whose step is not in ``keep``; collective."""
        if self.coordinator and self.root.is_dir():
            for p in sorted(self.root.iterdir()):
                if (
                    p.is_dir()
                    and p.name.startswith(_PREFIX)
                    and int(p.name[len(_PREFIX) :]) not in keep
                ):
                    self._trash(p)
        self._all_ok(True)

    # -- reading -------------------------------------------------------------------------

    def _verify_shard(self, gen: Generation) -> dict[str, Any]:
        rank_dir = _rank_dir(gen.path, self.rank)
        shard_path = rank_dir / _SHARD
        if gen.world_size != len(self.ranks):
            raise CheckpointError(
                f"generation step {gen.step} was written by {gen.world_size} ranks; "
                f"this job has {len(self.ranks)}"
            )
        if not shard_path.is_file():
            raise CheckpointError(f"shard of rank {self.rank} missing in {gen.path}")
        if _sha256(shard_path) != gen.shards[str(self.rank)]:
            raise CheckpointError(
                f"shard description {shard_path} does not match its manifest checksum"
            )
        shard = read_json(shard_path, "shard description")
        if shard.get("format") != SHARD_FORMAT or shard.get("step") != gen.step:
            raise CheckpointError(
                f"shard description {shard_path} does not belong to step {gen.step}"
            )
        for name, digest in dict(shard.get("files", {})).items():
            path = rank_dir / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing")
            if _sha256(path) != digest:
                raise CheckpointError(
                    f"checkpoint file {path} is corrupt or truncated (sha256 mismatch)"
                )
        return dict(shard)

    def _pick(self, role: str | None, step: int | None) -> Generation | None:
        gens = scan(self.root)
        if role is not None:
            gens = [g for g in gens if g.role == role]
        if step is not None:
            gens = [g for g in gens if g.step == step]
        return gens[-1] if gens else None

    def load(
        self, role: str | None, *, run_id: str | None = None, step: int | None = None
    ) -> tuple[Generation, dict[str, Any]]:
        """Select and read the newest generation of ``role`` (``None``: any role), or the
        one of ``step`` when given.

        Collective. Returns the generation and this rank's state tree. Raises
        :class:`CheckpointError` on every rank when any rank lacks the generation,
        holds a different one, or finds its shard corrupt.
        """
        error: Exception | None = None
        gen: Generation | None = None
        shard: dict[str, Any] = {}
        try:
            gen = self._pick(role, step)
            if gen is not None:
                if run_id is not None and gen.run_id != run_id:
                    raise CheckpointError(
                        f"generation step {gen.step} belongs to run {gen.run_id!r}, not {run_id!r}"
                    )
                shard = self._verify_shard(gen)
        except CheckpointError as exc:
            error, gen = exc, None
        lo, hi = self._min_max(-1 if gen is None else gen.step)
        if error is not None:
            raise error
        if lo < 0:
            what = "generation" if role is None else f"{role} generation"
            raise CheckpointError(
                f"some rank has no usable {what} in {self.root} (that rank reports why); "
                "refusing to restore"
            )
        if lo != hi:
            raise CheckpointError(
                f"ranks hold different generations (steps {lo}..{hi}); refusing to restore"
            )
        assert gen is not None  # lo >= 0 means this rank picked one
        specs = tensor_specs(shard["skeleton"])
        tensors = {k: torch.empty(shape, dtype=dtype) for k, (dtype, shape) in specs.items()}
        try:
            with per_rank_dcp():
                dcp_load(
                    tensors,
                    storage_reader=JsonMetadataReader(_rank_dir(gen.path, self.rank)),
                    no_dist=True,
                )
        except CheckpointError:
            raise
        except Exception as exc:  # DCP reports damage as assorted errors
            raise CheckpointError(
                f"reading shard of rank {self.rank} in {gen.path} failed: {exc!r}"
            ) from exc
        return gen, unflatten(shard["skeleton"], tensors)
