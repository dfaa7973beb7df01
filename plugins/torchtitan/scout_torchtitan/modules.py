"""Where a TorchTitan model keeps what SCOUT replays: blocks, embedding, LM head.

Contract: :func:`titan_modules` reads each model part's ``layers`` (a ``ModuleDict`` of wrapped
blocks, seen through by the core's discovery), ``tok_embeddings`` (first stage) and ``lm_head``
(last stage), naming layers by their canonical FQN. docs/torchtitan.md, "What attaches where".
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from scout_core import Config
from scout_core.plugin_api import Discovered, ModuleRef, discover_modules

__all__ = ["titan_modules"]


def titan_modules(model_parts: Sequence[nn.Module], config: Config | None = None) -> Discovered:
    """Blocks of every model part (in part order), the first stage's embedding, the last stage's
    LM head; ``config`` paths override, and by default a part without ``layers`` is a ValueError."""
    cfg = Config() if config is None else config
    layers: list[ModuleRef] = []
    embedding: ModuleRef | None = None
    lm_head: ModuleRef | None = None
    for part, model in enumerate(model_parts):
        path = cfg.layers
        if path is None:
            if not isinstance(getattr(model, "layers", None), nn.ModuleDict | nn.ModuleList):
                raise ValueError(
                    f"model part {part} ({type(model).__name__}) has no 'layers' ModuleDict or "
                    "ModuleList of blocks; it is not a TorchTitan decoder (name the blocks "
                    "with the SCOUT setting 'layers')"
                )
            path = "layers"
        found = discover_modules(model, layers=path, embedding=cfg.embedding, lm_head=cfg.lm_head)
        layers.extend(found.layers)
        if embedding is None:
            embedding = found.embedding
        if found.lm_head is not None:
            lm_head = found.lm_head
    # A tied LM head shares the embedding's weight but is a separate call: it stays, as in the core.
    return Discovered(layers=tuple(layers), embedding=embedding, lm_head=lm_head)
