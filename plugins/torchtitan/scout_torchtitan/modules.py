"""Where a TorchTitan model keeps what SCOUT replays: blocks, embedding, LM head.

TorchTitan 0.3 decoders (``torchtitan.models.common.decoder.Decoder``: llama3,
qwen3, deepseek_v3, ...) keep their transformer blocks in ``model.layers``, a
TorchTitan ``ModuleDict`` keyed ``"0"``, ``"1"``, ... (not an ``nn.ModuleList``),
the token embedding in ``tok_embeddings`` and the output projection in
``lm_head``. After ``parallelize_fn`` each block is usually wrapped twice:

* activation checkpointing (``--activation_checkpoint`` selective or full, on by
  default) swaps ``layers[k]`` for a ``CheckpointWrapper`` holding the block as
  ``_checkpoint_wrapped_module``;
* ``fully_shard`` (always applied, even for pure DDP) swaps that wrapper's class
  for ``FSDPCheckpointWrapper`` and registers the FSDP pre/post-forward hooks on
  it.

The core's discovery (``scout_core.plugin_api.discover_modules``) handles exactly
this: a ``ModuleDict`` of same-class blocks, looked up through the wrappers, each
layer with two handles (the block replay runs, the wrapper capture hooks), named
by TorchTitan's canonical FQN (``layers.3``: wrapper segments stripped, as its
checkpoints do). This module only says where to look on each model part.

Under pipeline parallelism each model part holds a slice of ``layers`` with the
original keys (stage 1 may hold ``layers.2`` and ``layers.3``); only the first
stage has ``tok_embeddings`` and only the last has ``lm_head`` (the others keep
the attribute as ``None``). With ``ChunkedLossWrapper`` the model skips
``lm_head`` in forward and the loss calls it once per sequence chunk; replay
captures its first grad-enabled call of the iteration (chunk 0).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from scout_core import Config
from scout_core.plugin_api import Discovered, ModuleRef, discover_modules

__all__ = ["titan_modules"]


def titan_modules(model_parts: Sequence[nn.Module], config: Config | None = None) -> Discovered:
    """Blocks of every model part (in part order), the first stage's embedding and the
    last stage's LM head.

    ``config.layers`` / ``.embedding`` / ``.lm_head`` name other paths, as for any
    model; by default the blocks are each part's ``layers``. Raises ``ValueError``
    when a part has no ``layers`` container and no path was configured: the model is
    not a TorchTitan decoder.
    """
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
    # A tied LM head (``enable_weight_tying``) shares the embedding's weight but is a
    # separate call with its own inputs, so it stays, as in the core's discovery.
    return Discovered(layers=tuple(layers), embedding=embedding, lm_head=lm_head)
