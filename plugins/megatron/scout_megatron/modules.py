"""Where the replayable blocks of Megatron model chunks are.

Contract: :func:`unwrap_chunk` follows ``.module`` through every wrapper (Megatron's DDP, torch
DDP, ``Float16Module``) without importing megatron-core; :func:`unwrap_wrappers` strips exactly
the wrappers, for checkpoints. In a ``GPTModel`` the blocks are ``decoder.layers`` (by global
``layer_number``), ``embedding`` on the first stage and ``output_layer`` on the last (tied
embeddings: it needs the embedding's weight). Docs: docs/megatron.md, "What attaches where".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from scout_core import UnsupportedSetupError

__all__ = ["ChunkModules", "chunk_modules", "unwrap_chunk", "unwrap_wrappers"]


def unwrap_wrappers(chunk: nn.Module) -> nn.Module:
    """The model under every wrapper Megatron-LM's ``unwrap_model`` strips (its DDP, FSDP,
    ``Float16Module``) and torch DDP, as ``save_checkpoint`` unwraps before saving."""
    from megatron.core.utils import unwrap_model

    module = chunk
    while True:
        inner: nn.Module = unwrap_model(module)
        if isinstance(inner, nn.parallel.DistributedDataParallel):
            inner = inner.module
        if inner is module:
            return module
        module = inner


def unwrap_chunk(chunk: nn.Module, attr: str = "decoder") -> nn.Module:
    """The module under DDP / Float16Module wrappers that has ``attr``."""
    module = chunk
    while not hasattr(module, attr):
        inner = getattr(module, "module", None)
        if not isinstance(inner, nn.Module):
            raise UnsupportedSetupError(
                f"model chunk {type(chunk).__name__} has no {attr!r} under its wrappers "
                f"(reached {type(module).__name__}); name the layers explicitly"
            )
        module = inner
    return module


@dataclass(frozen=True)
class ChunkModules:
    """The replayable blocks of one model chunk (paths relative to :attr:`root`)."""

    index: int
    """Position of the chunk in the list (its virtual pipeline stage)."""
    root: nn.Module
    layers_path: str
    layers: tuple[tuple[int, nn.Module], ...]
    """(global 1-based ``layer_number``, layer), in order."""
    embedding: nn.Module | None
    output_layer: nn.Module | None
    shared_output_weight: bool
    """The output layer uses the embedding's weight (it has none of its own)."""


def _get(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def chunk_modules(chunks: Any, layers: str = "decoder.layers") -> list[ChunkModules]:
    """The :class:`ChunkModules` of every chunk (a list, tuple, or one module)."""
    items = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
    out = []
    head = layers.split(".", maxsplit=1)[0]
    for index, chunk in enumerate(items):
        root = unwrap_chunk(chunk, head)
        stack = _get(root, layers)
        if not isinstance(stack, nn.ModuleList):
            raise UnsupportedSetupError(
                f"{layers!r} of model chunk {index} is {type(stack).__name__}, not a ModuleList"
            )
        numbered = []
        for position, layer in enumerate(stack):
            number = getattr(layer, "layer_number", None)
            numbered.append((int(number) if number is not None else position + 1, layer))
        embedding = getattr(root, "embedding", None) if getattr(root, "pre_process", True) else None
        output = (
            getattr(root, "output_layer", None) if getattr(root, "post_process", True) else None
        )
        shared = output is not None and getattr(output, "weight", None) is None
        out.append(
            ChunkModules(
                index=index,
                root=root,
                layers_path=layers,
                layers=tuple(numbered),
                embedding=embedding if isinstance(embedding, nn.Module) else None,
                output_layer=output if isinstance(output, nn.Module) else None,
                shared_output_weight=shared,
            )
        )
    return out
