"""Control flow every peer must share: one optimizer step per iteration, equal micro-batches.

Contract: :class:`ControlFlow` counts, on each rank, the grad-enabled training forwards of one
marker module; a boundary with no forward since the previous one is an extra optimizer step,
not a new iteration, so the step clock stays and this rank keeps entering replay collectives at
the same iterations as its peers. The counts since the last due round (:meth:`ControlFlow.take`)
travel in readiness as the exact surfaces ``<recipe>/steps`` and ``<recipe>/micro``; peers that
disagree (:func:`diverged`) make the round not ready before any payload collective, and a
``protocol_mismatch`` record names the outlier (:func:`describe`): a divergence is reported,
never a deadlock. A marker that never sees a forward leaves the clock as it was. Why, and which
module is the marker: docs/replay.md, "One round, step by step" (step 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from scout_core.decision.c3 import C3Result, Surface
from scout_core.vocabulary import Mode, Status

__all__ = ["CONTROL_SURFACES", "ControlFlow", "Counts", "describe", "diverged", "surfaces"]

CONTROL_SURFACES = ("steps", "micro")
"""Readiness surfaces of the control-flow counts, after the recipe's name."""

Counts = tuple[int, int]
"""(extra optimizer steps, training forwards of the marker) since the last due round."""


class ControlFlow:
    """This rank's control-flow counts (see docs/replay.md)."""

    def __init__(
        self, marker: nn.Module | None, *, replaying: Callable[[], bool] = lambda: False
    ) -> None:
        self._replaying = replaying
        self._forwards = 0  # since the last boundary
        self._round_forwards = 0  # since the last due round
        self._extra = 0  # extra optimizer steps since the last due round
        self._seen = False  # the marker has seen a training forward at all
        self._handle: RemovableHandle | None = None
        if marker is not None:
            self._handle = marker.register_forward_pre_hook(self._count)

    def _count(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not self._replaying():
            self._forwards += 1

    @property
    def iterating(self) -> bool:
        """Whether the coming optimizer step belongs to a new iteration (a training forward
        since the last boundary, or none seen yet at all)."""
        return self._forwards > 0 or not self._seen

    def boundary(self) -> bool:
        """Called at every replay boundary; True when it is an extra optimizer step (no
        training forward since the previous boundary), which starts no iteration."""
        forwards, self._forwards = self._forwards, 0
        if forwards == 0 and self._seen:
            self._extra += 1
            return True
        self._seen = self._seen or forwards > 0
        self._round_forwards += forwards
        return False

    def take(self) -> Counts:
        """The counts since the last due round, for this round's readiness; resets them."""
        out = (self._extra, self._round_forwards)
        self._extra = self._round_forwards = 0
        return out

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def surfaces(name: str, counts: Counts | None) -> list[Surface]:
    """The readiness surfaces of ``counts`` (none without counts, e.g. in a sweep)."""
    if counts is None:
        return []
    extra, micro = counts
    return [
        Surface(f"{name}/steps", Mode.EXACT, extra),
        Surface(f"{name}/micro", Mode.EXACT, micro),
    ]


def diverged(name: str, results: dict[str, C3Result]) -> list[C3Result]:
    """The control-flow surfaces on which the peers disagree."""
    out = []
    for leaf in CONTROL_SURFACES:
        found = results.get(f"{name}/{leaf}")
        if found is not None and found.status is not Status.AGREE:
            out.append(found)
    return out


def describe(result: C3Result) -> dict[str, Any]:
    """Record detail for one divergent count: what it counts and every peer's value."""
    leaf = result.surface.rsplit("/", 1)[-1]
    what = (
        "extra optimizer steps (a step without a training forward since the last one)"
        if leaf == "steps"
        else "training forwards (micro-batches) of the marker module"
    )
    counts: Sequence[Any] = result.evidence
    return {
        "divergence": "optimizer_steps" if leaf == "steps" else "micro_batches",
        "counted": what,
        "counts": {str(r): c for r, c in zip(result.ranks, counts, strict=True)},
    }
