"""Bridge's saves and loads through SCOUT's checkpoint gate: :class:`ScoutCheckpointManager`.

Bridge 0.4+ builds its checkpoint manager from ``CheckpointConfig.custom_manager_class``; this
class, named there, puts the gate between Bridge and its ``DefaultCheckpointManager`` (or inner).
Contract: a save while an SDC awaits recovery writes nothing; others are certified in the sidecar;
a load without ``ckpt_step`` restores the newest verified tag, agreed job-wide; without an enabled
session both go to the inner manager. Docs: docs/megatron.md, "Checkpoints through the gate".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from scout_core import CheckpointError
from scout_megatron.checkpoint import MegatronCheckpointIO, iteration_of, tag_of
from scout_megatron.gating import gate_of

__all__ = ["ScoutCheckpointManager"]

log = logging.getLogger(__name__)


def _default_manager(checkpoint_config: Any) -> Any:
    """Bridge's own manager (imports Bridge's checkpointing: needs its dependencies)."""
    from megatron.bridge.training.checkpointing import DefaultCheckpointManager

    return DefaultCheckpointManager(checkpoint_config)


class _BridgeIO:
    """One Bridge save or load as the core's ``CheckpointIO``: writes and reads go to the
    inner manager, tags are listed in ``checkpoint.save`` (or ``load``)."""

    def __init__(self, manager: ScoutCheckpointManager, ctx: Any, directory: str) -> None:
        self.manager, self.ctx = manager, ctx
        self.tags = MegatronCheckpointIO(directory, ctx.model, ctx.optimizer)
        self.loaded: tuple[int, int] | None = None
        self.callback_manager: Any = None

    @property
    def directory(self) -> str:
        return self.tags.directory

    def tag_for(self, step: int) -> str:
        return self.tags.tag_for(step)

    def save(self, tag: str) -> bool:
        self.manager.inner.save(self.ctx, self.callback_manager)
        return tag in self.tags.list_tags()

    def load(self, tag: str | None) -> tuple[int, int]:
        config = self.manager.checkpoint_config
        if tag is not None:
            if tag not in self.tags.list_tags():
                raise CheckpointError(f"no checkpoint {tag} in {self.directory}")
            config.ckpt_step = iteration_of(tag)
        self.loaded = tuple(self.manager.inner.load(self.ctx))
        assert self.loaded is not None
        return self.loaded

    def restored_step(self) -> int:
        if self.loaded is None:
            raise CheckpointError(f"nothing was loaded from {self.directory} yet")
        return int(self.loaded[0]) - 1

    def list_tags(self) -> Sequence[str]:
        return self.tags.list_tags()

    def writes_metadata(self) -> bool:
        return self.tags.writes_metadata()


class ScoutCheckpointManager:
    """Bridge's ``CheckpointManager`` protocol, gated by SCOUT (see the module doc)."""

    def __init__(self, checkpoint_config: Any, inner: Any = None) -> None:
        self.checkpoint_config = checkpoint_config
        self.inner = _default_manager(checkpoint_config) if inner is None else inner

    def save(self, ctx: Any, callback_manager: Any) -> None:
        """Bridge's save of iteration ``ctx.state.train_state.step``; refused after an
        unrecovered SDC. Collective."""
        gate = gate_of(ctx.model)
        if gate is None:
            self.inner.save(ctx, callback_manager)
            return
        io = _BridgeIO(self, ctx, str(self.checkpoint_config.save))
        io.callback_manager = callback_manager
        iteration = int(ctx.state.train_state.step)
        if not gate.save(io, tag_of(iteration)):
            log.warning("SCOUT refused Bridge's checkpoint of iteration %d", iteration)

    def load(self, ctx: Any) -> tuple[int, int]:
        """``(iteration, flops)`` of the newest verified tag, or of ``ckpt_step``. Collective."""
        gate = gate_of(ctx.model)
        step = getattr(self.checkpoint_config, "ckpt_step", None)
        if gate is None:
            return tuple(self.inner.load(ctx))
        directory = self.checkpoint_config.load or self.checkpoint_config.save
        io = _BridgeIO(self, ctx, str(directory))
        gate.load(io, None if step is None else tag_of(int(step)))
        assert io.loaded is not None
        return io.loaded

    def finalize_async_saves(
        self, state: Any, blocking: bool = False, terminate: bool = False
    ) -> None:
        self.inner.finalize_async_saves(state, blocking=blocking, terminate=terminate)
