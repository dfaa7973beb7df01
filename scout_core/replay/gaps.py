"""Why a peer has no replay evidence for a surface: reason codes that travel with the round.

Contract: a surface a peer could not produce is passed as ``None``, never compared as a value
(C3 reads it *inconclusive* on every peer: fail closed), and one more exact surface of the
round, ``<recipe>/gap``, carries the :class:`Gap` code of why (:func:`first_gap`), which
:func:`describe` turns into the record's reason per rank. A gap is never an SDC: a nonzero code
says which peer lacks evidence, not that its arithmetic is wrong. :func:`evidence` is the one
rule for "empty": a list of tensors that is empty or holds only ``None`` where the round
expected something has no evidence, since the constant signature of an empty list would blame
that peer for SDC. Missing evidence in a round: docs/replay.md, "One round, step by step".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum

import torch

from scout_core.replay.packing import sign

__all__ = ["Gap", "describe", "evidence", "first_gap"]


class Gap(IntEnum):
    """Reason codes, first one found wins (0: this peer has all its evidence)."""

    NONE = 0
    RAISED = 1
    """The replayed call raised on this peer (an unsupported op, out of memory)."""
    TRAINING_COLLECTIVE = 2
    """An instance-level ``forward`` under a parallel layout could reach a training collective."""
    NO_OUTPUTS = 3
    NO_PARAM_GRADS = 4
    NO_INPUT_GRADS = 5
    PARTNER_RAISED = 6
    """An EP all-to-all partner could not build its part: what this peer got is not comparable."""


_TEXT = {
    Gap.RAISED: "the replayed call raised",
    Gap.TRAINING_COLLECTIVE: "its instance-level forward could reach a training collective "
    "(not replayed)",
    Gap.NO_OUTPUTS: "the replayed call returned no tensor",
    Gap.NO_PARAM_GRADS: "the replay produced no parameter gradients (param_grad)",
    Gap.NO_INPUT_GRADS: "the replay produced no input gradients (input_grad)",
    Gap.PARTNER_RAISED: "an EP partner's part of the replayed all-to-all failed",
}


def describe(codes: Mapping[int, int]) -> dict[str, str]:
    """``{rank: reason}`` for the ranks whose gap code is nonzero (unknown codes named)."""
    out: dict[str, str] = {}
    for rank, code in sorted(codes.items()):
        if code:
            try:
                out[str(rank)] = _TEXT[Gap(code)]
            except ValueError:
                out[str(rank)] = f"gap code {code}"
    return out


def evidence(tensors: Iterable[torch.Tensor | None], *, expected: bool) -> int | None:
    """The surface's signature, or ``None`` when it is empty although ``expected``."""
    items: Sequence[torch.Tensor | None] = list(tensors)
    if expected and all(t is None for t in items):
        return None
    return sign(items)


def first_gap(values: Mapping[str, object]) -> Gap:
    """The first missing (``None``) of ``forward``, ``param_grad``, ``input_grad``, as a gap."""
    for surface, code in (
        ("forward", Gap.NO_OUTPUTS),
        ("param_grad", Gap.NO_PARAM_GRADS),
        ("input_grad", Gap.NO_INPUT_GRADS),
    ):
        if values[surface] is None:
            return code
    return Gap.NONE
