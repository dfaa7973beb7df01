"""The random streams a TorchTitan training step draws from, for replay to reproduce.

TorchTitan 0.3 seeds with ``dist_utils.set_determinism``: ``torch.manual_seed`` with
one seed for the whole SPMD mesh and a distinct offset per pipeline stage
(``distinct_seed_mesh_dims=["pp"]``), plus ``torch.distributed.tensor._random
.manual_seed`` for DTensor random ops. DTensor's ``OffsetBasedRNGTracker`` keeps no
state of its own: it draws from the device's default generator, moving its
seed/offset around each random op, so the device generator's state *is* the
tracker's. On CPU DTensor has no tracker at all. Python's ``random`` and NumPy are
not used by the training step (only by data shuffling, outside it).

So the streams are: the CPU default generator, and the current CUDA device's when
CUDA is available (guarded: nothing CUDA is touched on a CPU-only machine). Their
shape is the core's ``RngStream`` (name, get → CPU ``uint8`` tensor, set); phase 2
hands them to the adapter as ``extra_rng`` or relies on the core's defaults, which
are the same two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["TitanRng", "titan_rng_streams"]


class TitanRng(NamedTuple):
    """One generator: its name, a getter returning a CPU ``uint8`` state, a setter."""

    name: str
    get: Callable[[], torch.Tensor]
    set: Callable[[torch.Tensor], None]


def _cuda_get() -> torch.Tensor:
    return torch.cuda.get_rng_state(torch.cuda.current_device())


def _cuda_set(state: torch.Tensor) -> None:
    torch.cuda.set_rng_state(state, torch.cuda.current_device())


def titan_rng_streams() -> tuple[TitanRng, ...]:
    """``cpu`` always; ``cuda`` (current device) only when CUDA is available."""
    streams = [TitanRng("cpu", torch.get_rng_state, torch.set_rng_state)]
    if torch.cuda.is_available():
        streams.append(TitanRng("cuda", _cuda_get, _cuda_set))
    return tuple(streams)
