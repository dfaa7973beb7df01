r"""Tiny models and a training step shared by SCOUT's tests, benchmarks and the demo.

:class:`TinyLM` is an embedding, a ``ModuleList`` of residual MLP :class:`Block`\ s
(with dropout, so replay must reproduce the RNG) and an LM head: the smallest model
with every dense replay recipe. :func:`batch` and :func:`train_step` are one
deterministic, unchanged training iteration per (step, rank).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["VOCAB", "Block", "TinyLM", "batch", "train_step"]

VOCAB = 32


class Block(nn.Module):
    """A pre-norm residual MLP block with dropout (so replay must reproduce RNG)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(self.norm(x)))
        out: torch.Tensor = x + self.drop(self.fc2(h))
        return out


class TinyLM(nn.Module):
    """Embedding, a ``ModuleList`` of blocks, and an LM head."""

    def __init__(self, dim: int = 16, layers: int = 4, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]  # nn.Module call is untyped


def batch(step: int, rank: int, *, size: int = 4, seq: int = 8) -> torch.Tensor:
    """A deterministic token batch, different per rank and step (data parallel)."""
    gen = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randint(0, VOCAB, (size, seq + 1), generator=gen)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int) -> float:
    """One unchanged training iteration: forward, loss, backward, optimizer step."""
    tokens = batch(step, rank)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]  # torch stub lacks annotations
    optimizer.step()
    return float(loss.detach())
