"""TorchTitan's own checkpoints in the shape of the core's ``CheckpointIO``.

Contract: :class:`TitanCheckpointIO` names TorchTitan 0.3's DCP checkpoints
``<dump_folder>/<checkpoint.folder>/step-<N>`` (SCOUT step ``s`` is ``step-{s+1}``), complete once
``.metadata`` exists; ``save`` writes synchronously through the manager's own machinery (the gate
has decided), ``load`` is its load or the given raw one. docs/torchtitan.md, "Checkpoint gating".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from scout_core import CheckpointError, UnsupportedSetupError
from scout_torchtitan.optimizers import materialize_state_quietly

__all__ = ["TitanCheckpointIO", "step_of"]

_TAG = re.compile(r"^step-(\d+)$")


def step_of(tag: str) -> int:
    """TorchTitan's step number in a ``step-N`` tag; :class:`CheckpointError` otherwise."""
    match = _TAG.match(tag)
    if match is None:
        raise CheckpointError(f"{tag!r} is not a TorchTitan checkpoint tag (step-<N>)")
    return int(match.group(1))


class TitanCheckpointIO:
    """One TorchTitan job's checkpoints: the core's ``CheckpointIO`` over its manager."""

    def __init__(self, manager: Any, *, load: Callable[[int], Any] | None = None) -> None:
        if not getattr(manager, "enable", False):
            raise UnsupportedSetupError(
                "TorchTitan checkpointing is off; SCOUT's checkpoint gate needs it "
                "(--checkpoint.enable)"
            )
        for name in ("dcp_save", "_flattened_model_states_sd", "_create_checkpoint_id"):
            if not callable(getattr(manager, name, None)):
                raise UnsupportedSetupError(
                    f"{type(manager).__qualname__} has no {name}(): SCOUT writes TorchTitan "
                    "checkpoints through TorchTitan 0.3's CheckpointManager"
                )
        self.manager = manager
        self._load = manager.load if load is None else load

    @property
    def directory(self) -> str:
        """``<dump_folder>/<checkpoint.folder>``, where the ``step-N`` folders live."""
        return str(self.manager.folder)

    def tag_for(self, step: int) -> str:
        """TorchTitan's folder for SCOUT step ``step`` (0-based): ``step-{step + 1}``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return f"step-{step + 1}"

    def save(self, tag: str) -> bool:
        """Write the full training state as TorchTitan checkpoint ``tag`` (collective, sync)."""
        from torchtitan.components.checkpoint import AsyncMode

        mgr = self.manager
        mgr.maybe_wait_for_saving()
        mgr.dcp_save(
            mgr._flattened_model_states_sd(),
            checkpoint_id=mgr._create_checkpoint_id(step_of(tag)),
            async_mode=AsyncMode.DISABLED,
            enable_garbage_collection=True,
        )
        purge = getattr(mgr, "_purge_stale_checkpoints", None)
        if callable(purge):
            purge()
        return True

    def load(self, tag: str | None = None) -> Any:
        """Restore ``tag`` (None: the latest) into the live trainer; collective, returns True.
        ``CheckpointError`` when ``tag`` is incomplete, or for None when there is none."""
        tags = self.list_tags()
        if tag is None:
            if not tags:
                raise CheckpointError(f"no TorchTitan checkpoint in {self.directory}")
            step = -1
        else:
            if tag not in tags:
                raise CheckpointError(
                    f"no complete TorchTitan checkpoint {tag!r} in {self.directory}; "
                    f"present: {', '.join(tags) or 'none'}"
                )
            step = step_of(tag)
        target = step if step != -1 else step_of(tags[-1])
        # Step 0 is TorchTitan's model-only seed checkpoint; excluded optimizers stay as is.
        if target > 0 and "optimizer" not in getattr(self.manager, "exclude_from_loading", ()):
            materialize_state_quietly(self.manager.states.get("optimizer"))
        return self._load(step)

    def restored_step(self) -> int:
        """After :meth:`load`: SCOUT's step of the restored state (TorchTitan's step - 1)."""
        return int(self.manager.states["train_state"].step) - 1

    def list_tags(self) -> Sequence[str]:
        """Complete ``step-N`` checkpoints (with ``.metadata``), oldest first; fsspec works."""
        from torchtitan.tools import filesystem as fs

        if not fs.isdir(self.directory):
            return []
        steps = sorted(
            step_of(n)
            for n in fs.listdir(self.directory)
            if _TAG.match(n) and fs.isfile(fs.join(fs.join(self.directory, n), ".metadata"))
        )
        return [f"step-{s}" for s in steps]

    def writes_metadata(self) -> bool:
        """Global rank 0 writes DCP's ``.metadata`` and purges: it writes SCOUT's sidecar too."""
        import torch.distributed as dist

        return not dist.is_initialized() or dist.get_rank() == 0
