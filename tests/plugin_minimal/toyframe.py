"""toyframe: a toy training framework, for the smallest SCOUT plugin (``scout_toy``).

It knows nothing of SCOUT. An :class:`Engine` wraps a model in
``DistributedDataParallel``, owns an SGD optimizer and a config dict (whose ``"scout"``
key the plugin reads), and trains one batch of tokens per :meth:`Engine.train_batch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__version__ = "1.2.0"


class Engine:
    """A model, its optimizer and its config: what a framework hands its user."""

    def __init__(self, model: nn.Module, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.module = DistributedDataParallel(model)
        lr = float(self.config.get("lr", 0.05))
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=lr)

    def train_batch(self, tokens: torch.Tensor) -> float:
        """One step of next-token prediction on ``tokens`` (batch x sequence)."""
        logits = self.module(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return float(loss.detach())
