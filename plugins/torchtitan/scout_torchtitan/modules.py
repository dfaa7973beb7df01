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

So each layer has two faces: the **outer** module the model calls (FSDP hooks;
forward hooks fire once per training forward) and the **block** inside (pure
compute; under activation checkpointing it runs a second time during backward,
so hooks placed on it fire twice). Evidence names layers by TorchTitan's
canonical FQN (``layers.3``: wrapper segments stripped, as its checkpoints do).

Under pipeline parallelism each model part holds a slice of ``layers`` with the
original keys (stage 1 may hold ``layers.2`` and ``layers.3``); only the first
stage has ``tok_embeddings`` and only the last has ``lm_head`` (the others keep
the attribute as ``None``). With ``ChunkedLossWrapper`` the model skips
``lm_head`` in forward (``_skip_lm_head``) and the loss calls it per chunk.

The core's generic discovery (``discover_modules``) looks for the largest
``nn.ModuleList`` of same-class blocks and finds none here, hence this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

__all__ = ["TitanLayer", "TitanModule", "TitanModules", "find_titan_modules", "inner_block"]

_WRAPPER_ATTRS = ("_checkpoint_wrapped_module", "_orig_mod", "module")


@dataclass(frozen=True)
class TitanLayer:
    """One transformer block of one model part."""

    path: str
    """Canonical FQN, e.g. ``"layers.3"`` (same key on every PP stage that holds it)."""
    part: int
    """Index into ``trainer.model_parts``."""
    outer: nn.Module
    """What the model calls (FSDP / activation-checkpoint wrappers): hook here."""
    block: nn.Module
    """The TorchTitan block inside the wrappers: replay calls this."""


@dataclass(frozen=True)
class TitanModule:
    """The embedding or the LM head of one model part."""

    path: str
    part: int
    module: nn.Module


@dataclass(frozen=True)
class TitanModules:
    """What this rank's model parts hold."""

    layers: tuple[TitanLayer, ...]
    """In model order: by part, then by layer key."""
    embedding: TitanModule | None
    """``tok_embeddings`` of the first stage; None on other PP stages."""
    lm_head: TitanModule | None
    """``lm_head`` of the last stage; None on other PP stages."""


def inner_block(module: nn.Module) -> nn.Module:
    """``module`` with activation-checkpoint / compile / DDP wrappers looked through."""
    seen = 0
    while seen < 8:
        inner = next(
            (
                getattr(module, a)
                for a in _WRAPPER_ATTRS
                if isinstance(getattr(module, a, None), nn.Module)
            ),
            None,
        )
        if inner is None:
            return module
        module, seen = inner, seen + 1
    return module


def _layer_key(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (1 << 30, key)


def find_titan_modules(model_parts: Sequence[nn.Module]) -> TitanModules:
    """Blocks, embedding and LM head of ``trainer.model_parts`` (see the module docstring).

    Raises ``ValueError`` when a part has no ``layers`` container of blocks: the
    model is not a TorchTitan decoder and the core's generic discovery applies.
    """
    layers: list[TitanLayer] = []
    embedding: TitanModule | None = None
    lm_head: TitanModule | None = None
    for part, model in enumerate(model_parts):
        root = inner_block(model)
        container = getattr(root, "layers", None)
        if not isinstance(container, nn.ModuleDict | nn.ModuleList):
            raise ValueError(
                f"model part {part} ({type(root).__name__}) has no 'layers' ModuleDict or "
                "ModuleList of blocks; it is not a TorchTitan decoder"
            )
        items = (
            sorted(container.items(), key=lambda kv: _layer_key(kv[0]))
            if isinstance(container, nn.ModuleDict)
            else [(str(i), m) for i, m in enumerate(container)]
        )
        for key, outer in items:
            layers.append(TitanLayer(f"layers.{key}", part, outer, inner_block(outer)))
        emb = getattr(root, "tok_embeddings", None)
        if isinstance(emb, nn.Module) and embedding is None:
            embedding = TitanModule("tok_embeddings", part, emb)
        head = getattr(root, "lm_head", None)
        if isinstance(head, nn.Module):
            lm_head = TitanModule("lm_head", part, head)
    # A tied LM head (``enable_weight_tying``) shares the embedding's weight but is a
    # separate call with its own inputs, so it stays, as in the core's discovery.
    return TitanModules(tuple(layers), embedding, lm_head)
