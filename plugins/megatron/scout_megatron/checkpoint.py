"""Megatron checkpoints through ``megatron.core.dist_checkpointing``, in the CheckpointIO shape.

Contract: :class:`MegatronCheckpointIO` writes and reads checkpoints as Megatron-LM lays them out
(``iter_{s + 1:07d}`` after SCOUT step ``s``, a ``torch_dist`` sharded checkpoint of every chunk
and the optimizer, the tracker file written by global rank 0), so the gate can certify and
restore them and Megatron-LM can read them. It does not save ``args``, the scheduler, RNG state,
FLOP count or data position; a save leaves no process behind. Docs: docs/megatron.md,
"Checkpoints through the gate".
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from scout_core import CheckpointError
from scout_megatron.modules import unwrap_wrappers

__all__ = ["TRACKER_FILE", "MegatronCheckpointIO", "iteration_of", "tag_of"]

TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""Megatron-LM's file naming the latest complete iteration."""

CHECKPOINT_VERSION = 3.0
"""The value Megatron-LM writes as ``checkpoint_version`` in 0.16."""

_TAG = re.compile(r"^iter_(\d{7,})$")


def tag_of(iteration: int) -> str:
    """Megatron's directory name of the checkpoint after ``iteration`` iterations."""
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    return f"iter_{iteration:07d}"


def iteration_of(tag: str) -> int:
    """The iteration a tag names; :class:`~scout_core.CheckpointError` for another name."""
    match = _TAG.match(tag)
    if match is None:
        raise CheckpointError(f"{tag!r} is not a Megatron checkpoint name (iter_NNNNNNN)")
    return int(match.group(1))


class MegatronCheckpointIO:
    """One Megatron job's checkpoints in one directory. ``chunks`` may be wrapped; ``optimizer``
    None saves the model only; ``metadata`` (e.g. ``{"distrib_optim_sharding_type":
    "fully_reshardable"}``) goes to save and load alike (None: megatron-core's defaults)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        chunks: Sequence[nn.Module] | nn.Module,
        optimizer: Any = None,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.directory = str(directory)
        self.chunks: list[nn.Module] = [chunks] if isinstance(chunks, nn.Module) else list(chunks)
        self.optimizer = optimizer
        self.metadata = metadata
        self.last_loaded: dict[str, Any] | None = None
        """The state dict of the last load (common values included)."""
        self._restored: int | None = None

    def tag_for(self, step: int) -> str:
        """The checkpoint taken after SCOUT step ``step`` (0-based): ``iter_{step + 1}``."""
        return tag_of(step + 1)

    def path(self, tag: str) -> Path:
        iteration_of(tag)
        return Path(self.directory) / tag

    def list_tags(self) -> list[str]:
        """Complete checkpoints in the directory (``metadata.json`` present), oldest first."""
        from megatron.core.dist_checkpointing import check_is_distributed_checkpoint

        root = Path(self.directory)
        if not root.is_dir():
            return []
        found = []
        for entry in root.iterdir():
            match = _TAG.match(entry.name)
            if match and entry.is_dir() and check_is_distributed_checkpoint(str(entry)):
                found.append((int(match.group(1)), entry.name))
        return [name for _, name in sorted(found)]

    def latest(self) -> str | None:
        """The tag the tracker file names, or None when there is none."""
        tracker = Path(self.directory) / TRACKER_FILE
        try:
            text = tracker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            raise CheckpointError(f"{tracker} holds {text!r}, not an iteration number")
        return tag_of(int(text))

    def writes_metadata(self) -> bool:
        """Global rank 0 writes the tracker file, so it writes SCOUT's sidecar too."""
        return dist.get_rank() == 0

    def _chunk_key(self, index: int) -> str:
        return "model" if len(self.chunks) == 1 else f"model{index}"

    def _sharded_state_dict(self, iteration: int, *, loading: bool) -> dict[str, Any]:
        state: dict[str, Any] = {
            "iteration": iteration,
            "checkpoint_version": CHECKPOINT_VERSION,
        }
        for index, chunk in enumerate(self.chunks):
            model: Any = _model(chunk)  # a MegatronModule: sharded_state_dict is a method
            state[self._chunk_key(index)] = model.sharded_state_dict(metadata=self.metadata)
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.sharded_state_dict(
                state, is_loading=loading, metadata=self.metadata
            )
        return state

    def save(self, tag: str) -> bool:
        """Collective: write checkpoint ``tag`` and then the tracker file; True when written."""
        from megatron.core import dist_checkpointing

        iteration = iteration_of(tag)
        target = self.path(tag)
        if dist.get_rank() == 0:
            target.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with _in_process_results():
            dist_checkpointing.save(self._sharded_state_dict(iteration, loading=False), str(target))
        dist.barrier()
        if dist.get_rank() == 0:
            tracker = Path(self.directory) / TRACKER_FILE
            tmp = tracker.with_suffix(".tmp")
            tmp.write_text(str(iteration), encoding="utf-8")
            tmp.replace(tracker)
        dist.barrier()
        return True

    def load(self, tag: str | None = None) -> int:
        """Collective: restore chunks and optimizer from ``tag`` (None: the tracker's); returns
        the iteration. ``CheckpointError`` when that names no complete checkpoint."""
        from megatron.core import dist_checkpointing

        if tag is None:
            tag = self.latest()
            if tag is None:
                raise CheckpointError(f"no {TRACKER_FILE} in {self.directory}: nothing to load")
        target = self.path(tag)
        if not dist_checkpointing.check_is_distributed_checkpoint(str(target)):
            raise CheckpointError(f"{target} is not a complete Megatron checkpoint")
        iteration = iteration_of(tag)
        loaded = dist_checkpointing.load(
            self._sharded_state_dict(iteration, loading=True), str(target)
        )
        for index, chunk in enumerate(self.chunks):
            _model(chunk).load_state_dict(loaded[self._chunk_key(index)])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(loaded["optimizer"])
        self.last_loaded = loaded
        self._restored = int(loaded["iteration"])
        return self._restored

    def restored_step(self) -> int:
        """After :meth:`load`: the restored SCOUT step, ``iteration - 1`` (-1: before any step)."""
        if self._restored is None:
            raise CheckpointError(f"nothing was loaded from {self.directory} yet")
        return self._restored - 1


def _model(chunk: nn.Module) -> nn.Module:
    return unwrap_wrappers(chunk)


@contextlib.contextmanager
def _in_process_results() -> Iterator[None]:
    """Inside: megatron-core's ``torch_dist`` writer queues results in this process, not in a
    ``multiprocessing`` Manager it never shuts down (no-op where it has no such factory)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    # ``_get_write_results_queue()`` in 0.16, ``get_write_results_queue(mp_mode)`` from 0.17.
    names = [n for n in _RESULTS_QUEUE if getattr(filesystem_async, n, None) is not None]
    originals = {n: getattr(filesystem_async, n) for n in names}
    for name in names:
        setattr(filesystem_async, name, _plain_queue)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(filesystem_async, name, original)


_RESULTS_QUEUE = ("_get_write_results_queue", "get_write_results_queue")


def _plain_queue(*_args: Any, **_kwargs: Any) -> queue.Queue[Any]:
    return queue.Queue()
