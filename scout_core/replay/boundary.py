"""The step clock and the boundary events: one event per training iteration.

Contract: :class:`StepClock` turns the public step hooks of the listed optimizers into exactly
one boundary per iteration, however many optimizers the job has and however often a framework
steps each (``steps_per_iteration``): ``pre(index)`` runs before an optimizer's first step of
the iteration, the boundary right after every optimizer has taken its first step (the last
point where no parameter of the iteration has moved on any rank), and the iteration ends when
each has taken its count; a step beyond that starts the next. :class:`BoundaryEvents` hands
every subscriber the frozen :class:`Boundary`; nobody writes into the driver, so the order of
subscription does not matter. The rules and why: docs/replay.md, "When the boundary fires".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

if TYPE_CHECKING:
    from scout_core.records.record import Record
    from scout_core.replay.runner import RoundOutcome
    from scout_core.replay.schedule import Recipe

__all__ = ["Boundary", "BoundaryEvents", "StepClock"]


@dataclass(frozen=True, slots=True)
class Boundary:
    """One training iteration's replay boundary, as the replay driver publishes it."""

    step: int
    """The 0-based iteration whose optimizer update just completed."""
    due: tuple[Recipe, ...]
    """The recipes the schedule made due at this step (empty on most steps)."""
    rounds: tuple[RoundOutcome, ...]
    """This rank's round outcomes of the due recipes (a skipped recipe has none)."""
    custody: tuple[Record, ...] = ()
    """This rank's first custody or buddy verdict (:mod:`.custody`, :mod:`.buddy`) since the
    last restore, at every later boundary: a gate deciding only where recipes are due sees it."""


Listener = Callable[[Boundary], None]


class BoundaryEvents:
    """The subscribers of one driver's boundaries; called in subscription order."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn(boundary)`` at every boundary from now on; returns the remover."""
        self._listeners.append(fn)

        def remove() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)

        return remove

    def publish(self, boundary: Boundary) -> None:
        """Hand ``boundary`` to every subscriber (an error propagates to the step)."""
        for fn in tuple(self._listeners):
            fn(boundary)


class StepClock:
    """One boundary per iteration from the step hooks of several optimizers (see docs/replay.md)."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        steps_per_iteration: Sequence[int],
        *,
        pre: Callable[[int], None],
        boundary: Callable[[], None],
    ) -> None:
        if len(steps_per_iteration) != len(optimizers):
            raise ValueError("steps_per_iteration needs one count per optimizer")
        if any(int(n) < 1 for n in steps_per_iteration):
            raise ValueError(f"steps per iteration must be >= 1, got {list(steps_per_iteration)}")
        self._need = [int(n) for n in steps_per_iteration]
        self._taken = [0] * len(optimizers)
        self._fired = False
        self._pre = pre
        self._boundary = boundary
        self._handles: list[RemovableHandle] = []
        for i, opt in enumerate(optimizers):
            self._handles.append(opt.register_step_pre_hook(self._pre_hook(i)))
            self._handles.append(opt.register_step_post_hook(self._post_hook(i)))

    def _pre_hook(self, index: int) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if self._taken[index] == 0:
                self._pre(index)

        return hook

    def _post_hook(self, index: int) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            taken = self._taken
            taken[index] += 1
            try:
                if not self._fired and all(taken):
                    self._fired = True
                    self._boundary()
            finally:
                if all(t >= n for t, n in zip(taken, self._need, strict=True)):
                    self._taken = [0] * len(taken)
                    self._fired = False

        return hook

    def reset(self) -> None:
        """Forget a partly stepped iteration (after a restore: training starts anew)."""
        self._taken = [0] * len(self._taken)
        self._fired = False

    def close(self) -> None:
        """Remove the hooks (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
