"""TorchTitan's own checkpoints in the shape of the core's ``CheckpointIO`` (PLUGIN_API.md).

TorchTitan 0.3's ``CheckpointManager`` writes one DCP checkpoint per saved step
into ``<dump_folder>/<checkpoint.folder>/step-<N>`` (``.metadata`` plus one
``__<rank>_0.distcp`` per rank), where ``N`` is the trainer's 1-based step. A
checkpoint holds the flattened model state dict (canonical FQNs, DTensor shards),
the optimizer (FQN-flattened, ``OptimizersContainer.state_dict``), the LR
schedulers, the dataloader and ``train_state`` (the trainer's ``step`` and
``ntokens_seen``); loading restores all of them, the step included. A folder is a
*complete* checkpoint once its ``.metadata`` exists (DCP's coordinator, global rank
0, writes it last); ``keep_latest_k`` purges old folders from rank 0.

[Steps and tags]
SCOUT counts 0-based iterations whose optimizer step has completed; TorchTitan's
``trainer.step`` is that number plus one when ``checkpointer.save`` runs. So SCOUT
step ``s`` is TorchTitan's ``step-{s+1}``: :meth:`TitanCheckpointIO.tag_for`.

[What it calls]
``save`` writes synchronously through the manager's own machinery
(``dcp_save`` of its flattened states into its ``step-N`` path, then its purge), not
through ``manager.save``, whose interval policy would skip the write: the caller
(SCOUT's gate, deciding at TorchTitan's own save points) has already decided.
Those helpers are ``CheckpointManager`` methods of TorchTitan 0.3
(``_flattened_model_states_sd``, ``_create_checkpoint_id``,
``_purge_stale_checkpoints``), stable within the supported 0.3.x range.
``load`` is ``manager.load(step)``, TorchTitan's public entry point, unless the
caller passes the load to use (SCOUT's gate wiring passes the manager's own ``_load``,
which its gated ``load`` would otherwise re-enter). Before a load that restores the
optimizer, each inner optimizer without state gets it quietly
(:func:`~scout_torchtitan.optimizers.materialize_state_quietly`), so TorchTitan's
zero-lr state creation does not look like a training step to SCOUT's clock.
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
        """Restore ``tag`` (None: TorchTitan's latest) into the live trainer (collective).

        Returns TorchTitan's ``load`` result (True). Raises :class:`CheckpointError`
        when ``tag`` is not a complete checkpoint, or when there is none for None.
        """
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
        """Complete ``step-N`` checkpoints (with ``.metadata``), oldest first.

        Goes through TorchTitan's ``tools.filesystem``, so remote (fsspec) folders work.
        """
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
