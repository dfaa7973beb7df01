"""DeepSpeed's own checkpoints, gated by the core: the checkpoint IO and the engine wiring.

Contract: :class:`DeepSpeedCheckpointIO` states one ``save_dir``'s facts (tag
``global_step{s+1}`` for SCOUT step ``s``; complete once ``*model_states.pt`` exists; sidecar
written by the rank that writes ``latest``). :func:`wire` routes the engine's save/load
through the core's gate with DeepSpeed's return values; its undo removes them. Every rank
calls them at the same point. Docs: docs/deepspeed.md, "Checkpoint gating".
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from typing import Any

from scout_core import CheckpointError, Failure, UnsupportedSetupError
from scout_core.plugin_api import FrameworkGate, Recovered, shadow_methods
from scout_core.plugin_api import gate_of as gate_on
from scout_core.plugin_api import recover as recover_through

__all__ = ["DeepSpeedCheckpointIO", "MissingTagError", "Recovered", "gate_of", "recover", "wire"]


class MissingTagError(CheckpointError):
    """The tag (or DeepSpeed's ``latest``) to load does not exist in the directory."""


class DeepSpeedCheckpointIO:
    """``CheckpointIO`` over one ``save_dir``. ``save`` / ``load`` default to the engine's methods
    (pass the originals when those are wired); ``args`` / ``kwargs`` follow dir and tag."""

    def __init__(
        self,
        engine: Any,
        directory: str | os.PathLike[str],
        *args: Any,
        save: Callable[..., Any] | None = None,
        load: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.engine = engine
        self._dir = os.fspath(directory)
        self._save = engine.save_checkpoint if save is None else save
        self._load = engine.load_checkpoint if load is None else load
        self._args, self._kwargs = args, kwargs

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def originals(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The save and load callables this IO calls."""
        return self._save, self._load

    def tag_for(self, step: int) -> str:
        return f"global_step{step + 1}"

    def save(self, tag: str) -> bool:
        return bool(self._save(self._dir, tag, *self._args, **self._kwargs))

    def load(self, tag: str | None) -> Any:
        if tag is not None and not os.path.isdir(os.path.join(self._dir, tag)):
            raise MissingTagError(f"no DeepSpeed checkpoint tag {tag!r} in {self._dir}")
        out = self._load(self._dir, tag, *self._args, **self._kwargs)
        if out is None or out[0] is None:
            raise MissingTagError(f"DeepSpeed found no checkpoint to load in {self._dir}")
        return out

    def restored_step(self) -> int:
        return int(self.engine.global_steps) - 1

    def _complete(self, name: str) -> bool:
        return bool(glob.glob(os.path.join(self._dir, glob.escape(name), "*model_states.pt")))

    def list_tags(self) -> Sequence[str]:
        if not os.path.isdir(self._dir):
            return []
        names = [n for n in os.listdir(self._dir) if self._complete(n)]
        return sorted(names, key=lambda n: os.path.getmtime(os.path.join(self._dir, n)))

    def writes_metadata(self) -> bool:
        local = bool(getattr(self.engine, "use_node_local_storage", lambda: False)())
        return int(self.engine.local_rank if local else self.engine.global_rank) == 0


def wire(engine: Any, gate: FrameworkGate) -> Callable[[], None]:
    """Shadow ``engine.save_checkpoint`` / ``load_checkpoint`` with the gate's; the undo."""
    save, load = engine.save_checkpoint, engine.load_checkpoint

    def save_checkpoint(save_dir: str, tag: Any = None, *args: Any, **kwargs: Any) -> bool:
        """``engine.save_checkpoint``, refused (False) while replay's SDC awaits recovery."""
        io = DeepSpeedCheckpointIO(engine, save_dir, *args, save=save, load=load, **kwargs)
        name = f"global_step{engine.global_steps}" if tag is None else str(tag)
        return gate.save(io, name)

    def load_checkpoint(load_dir: str, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``engine.load_checkpoint``; with no tag, the newest *verified* tag of the sidecar."""
        io = DeepSpeedCheckpointIO(engine, load_dir, *args, save=save, load=load, **kwargs)
        try:
            return gate.load(io, None if tag is None else str(tag))
        except MissingTagError:
            return None, None  # what DeepSpeed itself returns when there is nothing to load

    return shadow_methods(engine, save_checkpoint=save_checkpoint, load_checkpoint=load_checkpoint)


def gate_of(engine: Any) -> FrameworkGate | None:
    """The checkpoint gate attached to ``engine``, or None."""
    return gate_on(engine)


def recover(
    engine: Any, failure: Failure | str | None, *, load_dir: str | None = None, **kwargs: Any
) -> Recovered:
    """Load the tag the checkpoint gate trusts after ``failure`` (docs/checkpoint_gate.md,
    "Retrieval"). Collective. ``load_dir`` (default: that of the last save or load) also adopts
    its sidecar (a fresh process); ``kwargs`` go to ``engine.load_checkpoint``. Writes a
    ``scout.checkpoint/1`` retrieve record."""
    gate = gate_of(engine)
    if gate is None:
        raise UnsupportedSetupError(
            "scout_deepspeed.recover needs SCOUT's checkpoint gate on this engine (an enabled "
            '"scout" section with replay and "gate": true)'
        )
    last = gate.last_io
    directory = load_dir if load_dir is not None else None if last is None else last.directory
    if directory is None:
        raise CheckpointError("scout_deepspeed.recover: no save_dir known yet; pass load_dir=")
    if isinstance(last, DeepSpeedCheckpointIO):  # DeepSpeed's own methods, not the wired ones
        save, load = last.originals
    else:
        save, load = type(engine).save_checkpoint, type(engine).load_checkpoint
        save, load = save.__get__(engine), load.__get__(engine)
    io = DeepSpeedCheckpointIO(engine, directory, save=save, load=load, **kwargs)
    return recover_through(engine, failure, io, what="engine")
