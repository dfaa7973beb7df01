"""A sharded parameter's local part: what this rank holds, reached without a collective.

FSDP2, HSDP and TP parameters, gradients and optimizer state are DTensors; SCOUT touches only
the local shard, as materialising the global tensor runs a collective on the training group.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["local_shard"]


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t
