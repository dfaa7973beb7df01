"""Durable gate checkpoints: DCP shards, a JSON manifest per generation, atomic commit.

Contract: candidates and verified generations outlive the process in ``checkpoint_dir``
(one shared file system). Each rank writes its shard as its own DCP checkpoint, one
reduction confirms every shard, and renaming the temp directory commits, so a ``.tmp-*``
directory is never selected. A load checks the manifest and sha256 sums and agrees on the
pick job-wide before anything is applied. Layout and commit: docs/checkpoint_gate.md, "On disk".
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from scout_core.checkpoint.dcp_io import (
    JSON_METADATA,
    JsonMetadataReader,
    JsonMetadataWriter,
    fsync_dir,
    per_rank_dcp,
    read_json,
    write_json,
)
from scout_core.checkpoint.generations import (
    MANIFEST,
    MANIFEST_FORMAT,
    ROLES,
    SHARD,
    SHARD_FORMAT,
    TMP_PREFIX,
    TRASH_PREFIX,
    Generation,
    generation_name,
    generation_step,
    rank_dir,
    read_manifest,
    scan,
    sha256_of,
)
from scout_core.checkpoint.skeleton import flatten, unflatten
from scout_core.checkpoint.storage import STORAGE_ERRORS, describe, error_code
from scout_core.checkpoint.validate import (
    Spec,
    check_dcp_metadata,
    check_int,
    inside,
    plain_name,
    skeleton_specs,
    specs_nbytes,
)
from scout_core.decision.agreement import all_ok, check_group, min_max, reduce_max
from scout_core.errors import CheckpointError

__all__ = ["DurableStore"]

_FAR = 1 << 62
_CODE_SPAN = 1 << 16
"""The agreement word keeps a failing rank's errno below this."""
_DESCRIPTIONS = frozenset({SHARD, JSON_METADATA, ".metadata"})
"""Files of a shard that hold no tensor bytes (the bytes on disk exclude them)."""
log = logging.getLogger(__name__)


class DurableStore:
    """Persists, promotes, discards and loads gate generations for one rank.

    Every method that changes or reads the store is collective over ``group`` (a diagnostic
    Gloo group over the whole job, never ``WORLD``); a failure on any rank raises
    :class:`CheckpointError` on all. The first of ``ranks`` coordinates (manifests, renames).
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
        files = {p.name: sha256_of(p) for p in sorted(rank_dir.iterdir()) if p.is_file()}
        shard = {
            "format": SHARD_FORMAT,
            "step": step,
            "rank": self.rank,
            "run_id": self.run_id,
            "skeleton": skeleton,
            "files": files,
            "nbytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        }
        write_json(rank_dir / SHARD, shard)

    def _agree(self, error: BaseException | None, what: str) -> None:
        """Agree job-wide that every rank's part of ``what`` worked; else raise on every rank,
        naming the lowest failing rank and its ``errno`` text (whichever rank writes the record)."""
        # One word: the lowest failing rank high (MAX of -rank picks it), its errno low.
        word = -self.rank * _CODE_SPAN + min(error_code(error), _CODE_SPAN - 1) if error else -_FAR
        failed, lowest = reduce_max([int(error is not None), word], self.group)
        if failed:
            rank, code = -(lowest // _CODE_SPAN), lowest % _CODE_SPAN
            if error is not None:
                why = f" (this rank: {describe(error)})"
            else:
                why = f" ({os.strerror(code)})" if code else ""
            raise CheckpointError(f"{what} failed on rank {rank}{why}") from error

    def persist(self, step: int, tree: Mapping[str, Any], *, role: str = "candidate") -> Generation:
        """Write this rank's ``tree`` as generation ``step`` and commit atomically, job-wide. A
        local failure (a full disk, DCP's ``CheckpointException``) is agreed at the next phase:
        nothing is committed, the temp dir is removed, and no rank is left waiting."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        tmp = self.root / f"{TMP_PREFIX}{generation_name(step)}"
        final = self.root / generation_name(step)
        error: BaseException | None = None
        if self.coordinator:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                self._remove_leftovers()
                tmp.mkdir()
            except STORAGE_ERRORS as exc:
                error = exc
        try:
            self._agree(error, f"preparing {tmp}")  # everyone waits for the clean temp dir
            try:
                self._write_shard(rank_dir(tmp, self.rank), step, tree)
                fsync_dir(tmp)
            except STORAGE_ERRORS as exc:  # agreed job-wide right below
                error = exc
            self._agree(error, f"writing the shards of step {step} to {tmp}")
            if self.coordinator:
                try:
                    self._commit(tmp, final, step, role)
                except STORAGE_ERRORS as exc:
                    error = exc
            self._agree(error, f"committing step {step} in {self.root}")
        except CheckpointError:
            self._clean_up(tmp)
            raise
        return read_manifest(final)

    def _commit(self, tmp: Path, final: Path, step: int, role: str) -> None:
        shards = {str(r): sha256_of(rank_dir(tmp, r) / SHARD) for r in self.ranks}
        manifest = {
            "format": MANIFEST_FORMAT,
            "role": role,
            "step": step,
            "run_id": self.run_id,
            "world_size": len(self.ranks),
            "shards": shards,
            "nbytes": {
                str(r): int(read_json(rank_dir(tmp, r) / SHARD, "shard description")["nbytes"])
                for r in self.ranks
            },
            "time": time.time(),
        }
        write_json(tmp / MANIFEST, manifest)
        if final.exists():
            self._trash(final)
        os.replace(tmp, final)  # the commit point
        fsync_dir(self.root)

    def _clean_up(self, tmp: Path) -> None:
        """After a failed persist: no temporary directory may be left behind. Each rank
        removes its own shard (the directory may not be shared), the coordinator the rest."""
        with contextlib.suppress(OSError):
            shutil.rmtree(rank_dir(tmp, self.rank), ignore_errors=True)
            if not self.coordinator and tmp.is_dir() and not any(tmp.iterdir()):
                tmp.rmdir()
        if self.coordinator:
            shutil.rmtree(tmp, ignore_errors=True)
            if tmp.exists():
                log.warning("could not remove %s after a failed checkpoint write", tmp)

    def _remove_leftovers(self) -> None:
        for stale in self.root.iterdir():  # leftovers of a writer that died
            if stale.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(stale, ignore_errors=True)

    def _trash(self, gen: Path) -> None:
        trash = gen.with_name(f"{TRASH_PREFIX}{gen.name}-{time.monotonic_ns()}")
        os.replace(gen, trash)  # atomic: the generation is gone before it is deleted
        fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def set_role(self, step: int, role: str) -> None:
        """Change generation ``step``'s role (promotion); collective."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        error: BaseException | None = None
        if self.coordinator:
            gen = self.root / generation_name(step)
            try:
                data = read_json(gen / MANIFEST, "manifest")
                if not isinstance(data, dict):
                    raise CheckpointError(f"manifest {gen / MANIFEST} is not an object")
                data["role"] = role
                write_json(gen / MANIFEST, data)
            except STORAGE_ERRORS as exc:
                error = exc
        self._agree(error, f"marking step {step} as {role}")

    def discard(self, step: int) -> None:
        """Remove generation ``step`` (never selected again); collective."""
        self.discard_where(lambda s: s == step)

    def discard_except(self, keep: set[int]) -> None:
        """Remove every committed generation whose step is not in ``keep``; collective."""
        self.discard_where(lambda s: s not in keep)

    def discard_where(self, drop: Callable[[int], bool]) -> None:
        """Remove every committed generation whose step ``drop`` selects; collective."""
        error: BaseException | None = None
        if self.coordinator:
            try:
                if self.root.is_dir():
                    for p in sorted(self.root.iterdir()):
                        step = generation_step(p.name)
                        if p.is_dir() and step is not None and drop(step):
                            self._trash(p)
            except STORAGE_ERRORS as exc:
                error = exc
        self._agree(error, f"removing old generations from {self.root}")

    # -- reading -------------------------------------------------------------------------

    def _verify_shard(self, gen: Generation) -> tuple[dict[str, Any], dict[str, Spec]]:
        """This rank's shard description and specs, every checksum, path and size checked."""
        if gen.world_size != len(self.ranks):
            raise CheckpointError(
                f"generation step {gen.step} was written by {gen.world_size} ranks; "
                f"this job has {len(self.ranks)}"
            )
        shard_dir = inside(rank_dir(gen.path, self.rank), gen.path, "shard directory")
        shard_path = inside(shard_dir / SHARD, shard_dir, "shard description")
        if not shard_path.is_file():
            raise CheckpointError(f"shard of rank {self.rank} missing in {gen.path}")
        if sha256_of(shard_path) != gen.shards[str(self.rank)]:
            raise CheckpointError(
                f"shard description {shard_path} does not match its manifest checksum"
            )
        shard = read_json(shard_path, "shard description")
        if (
            not isinstance(shard, dict)
            or shard.get("format") != SHARD_FORMAT
            or shard.get("step") != gen.step
        ):
            raise CheckpointError(
                f"shard description {shard_path} does not belong to step {gen.step}"
            )
        listed = shard.get("files")
        if not isinstance(listed, dict):
            raise CheckpointError(f"shard description {shard_path} lists no files")
        sizes: dict[str, int] = {}
        for name, digest in listed.items():
            path = inside(shard_dir / plain_name(name, "checkpoint file"), shard_dir, "file")
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing")
            if sha256_of(path) != digest:
                raise CheckpointError(
                    f"checkpoint file {path} is corrupt or truncated (sha256 mismatch)"
                )
            sizes[name] = path.stat().st_size
        specs = skeleton_specs(shard.get("skeleton"))
        total = specs_nbytes(specs)
        claimed = [shard.get("nbytes", total), gen.nbytes.get(str(self.rank), total)]
        on_disk = sum(n for name, n in sizes.items() if name not in _DESCRIPTIONS)
        if any(check_int(c, f"{shard_path}: nbytes") != total for c in claimed) or total > on_disk:
            raise CheckpointError(
                f"shard of rank {self.rank} in {gen.path} describes {total} tensor bytes; its "
                f"manifest and description say {claimed}, the disk holds {on_disk}"
            )
        if JSON_METADATA not in sizes:
            raise CheckpointError(f"shard {shard_dir} lists no {JSON_METADATA}")
        meta = shard_dir / JSON_METADATA
        check_dcp_metadata(read_json(meta, "DCP metadata"), files=sizes, specs=specs, where=meta)
        return dict(shard), specs

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
        """Read the newest generation of ``role`` (``None``: any), or the one of ``step``, into
        staging. Every rank checks its shard first; one that lacks it, holds another or finds
        it damaged makes every rank raise. The caller applies the tree only once every rank
        can (:func:`.state.check_tree`)."""
        error: BaseException | None = None
        gen: Generation | None = None
        shard: dict[str, Any] = {}
        specs: dict[str, Spec] = {}
        try:
            gen = self._pick(role, step)
            if gen is not None:
                if run_id is not None and gen.run_id != run_id:
                    raise CheckpointError(
                        f"generation step {gen.step} belongs to run {gen.run_id!r}, not {run_id!r}"
                    )
                shard, specs = self._verify_shard(gen)
        except STORAGE_ERRORS as exc:  # malformed input of any kind: agreed below
            error, gen = exc, None
        lo, hi = self._min_max(-1 if gen is None else gen.step)
        if isinstance(error, CheckpointError):
            raise error
        if error is not None:
            raise CheckpointError(f"reading {self.root} failed: {describe(error)}") from error
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
        tree: dict[str, Any] = {}
        try:
            tree = self._stage(gen, shard, specs)
        except STORAGE_ERRORS as exc:  # an allocation or a read failed here only
            error = exc
        self._agree(error, f"reading generation step {gen.step} from {gen.path}")
        return gen, tree

    def _stage(
        self, gen: Generation, shard: Mapping[str, Any], specs: Mapping[str, Spec]
    ) -> dict[str, Any]:
        """Read this rank's checked shard into fresh tensors (staging)."""
        tensors = {k: torch.empty(shape, dtype=dtype) for k, (dtype, shape) in specs.items()}
        with per_rank_dcp():
            dcp_load(
                tensors,
                storage_reader=JsonMetadataReader(rank_dir(gen.path, self.rank)),
                no_dist=True,
            )
        staged = unflatten(shard["skeleton"], tensors)
        if not isinstance(staged, dict):
            raise CheckpointError(f"shard of rank {self.rank} in {gen.path} holds no state tree")
        return staged
