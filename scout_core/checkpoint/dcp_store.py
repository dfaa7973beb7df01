"""The core's own checkpoints as a :class:`~scout_core.checkpoint.io.CheckpointIO`.

Contract: :class:`DcpCheckpointIO` writes the state a bitwise resume needs as one tag per
step (``step-00000012``, a :mod:`.durable` generation), so a plain-PyTorch job can keep
durable checkpoints under the :class:`~scout_core.checkpoint.framework_gate.FrameworkGate`;
it is the reference :func:`scout_core.testing.check_checkpoint_io` checks plugins against.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.durable import DurableStore
from scout_core.checkpoint.generations import (
    Generation,
    generation_name,
    generation_step,
    scan,
)
from scout_core.checkpoint.recovery import restore_agreed
from scout_core.checkpoint.state import capture_tree
from scout_core.errors import CheckpointError
from scout_core.integration.adapter import RngStream
from scout_core.integration.adapter_base import default_rng_streams
from scout_core.topology.groups import diagnostic_group

__all__ = ["DcpCheckpointIO"]

ExtraState = Callable[[], Mapping[str, Any]]


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class DcpCheckpointIO:
    """Model, optimizers, RNG streams and caller state as DCP tags in ``directory``;
    collective at construction (unless ``group`` is given) and in :meth:`save` / :meth:`load`.
    ``extra_state()`` returns caller state to save with each tag; load updates it in place."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        rng_streams: Sequence[RngStream] | None = None,
        extra_state: ExtraState | None = None,
        group: dist.ProcessGroup | None = None,
        run_id: str = "scout",
    ) -> None:
        self.model = model
        self.optimizers = (
            [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        )
        self.rng_streams = list(default_rng_streams() if rng_streams is None else rng_streams)
        self.extra_state = extra_state
        ranks = list(range(dist.get_world_size()))
        self._store = DurableStore(
            directory,
            group=diagnostic_group() if group is None else group,
            ranks=ranks,
            run_id=run_id,
        )
        self._restored = -1

    # -- CheckpointIO ----------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return str(self._store.root)

    def tag_for(self, step: int) -> str:
        return generation_name(step)

    def _step(self, tag: str) -> int:
        step = generation_step(tag)
        if step is None:
            raise CheckpointError(
                f"{tag!r} is not a tag of this store; tags are {generation_name(0)!r}-style"
            )
        return step

    def save(self, tag: str) -> bool:
        """Write tag ``tag`` atomically; raises :class:`CheckpointError` on every rank when
        any rank's write failed (nothing is committed then). Collective."""
        step = self._step(tag)
        extra = None if self.extra_state is None else self.extra_state()
        tree = capture_tree(self.model, self.optimizers, self.rng_streams, extra, _host_copy)
        self._store.persist(step, tree, role="saved")
        return True

    def load(self, tag: str | None) -> Generation:
        """Restore ``tag`` (None: the newest tag) bitwise; returns its generation. Raises
        :class:`CheckpointError` on every rank when any rank lacks it. Collective."""
        step = None if tag is None else self._step(tag)
        gen, tree = self._store.load(None, step=step)
        target: MutableMapping[str, Any] | None = None
        if self.extra_state is not None:
            live = self.extra_state()
            target = live if isinstance(live, MutableMapping) else dict(live)
        restore_agreed(
            tree,
            self.model,
            self.optimizers,
            self.rng_streams,
            target,
            group=self._store.group,
            what=f"tag {generation_name(gen.step)}",
        )
        self._restored = gen.step
        return gen

    def restored_step(self) -> int:
        return self._restored

    def list_tags(self) -> list[str]:
        return [g.path.name for g in scan(self._store.root)]

    def writes_metadata(self) -> bool:
        return self._store.coordinator
