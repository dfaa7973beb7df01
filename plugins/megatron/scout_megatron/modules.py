"""Where the replayable blocks of Megatron model chunks are.

A Megatron job hands over a *list* of model chunks (one per virtual pipeline stage),
each possibly wrapped: Megatron's ``DistributedDataParallel``, torch DDP,
``Float16Module``. All of them keep the wrapped module in ``.module``, which is what
``megatron.core.utils.get_attr_wrapped_model`` follows; :func:`unwrap_chunk` does the
same without importing megatron-core. :func:`unwrap_wrappers` strips exactly the
wrappers (``megatron.core.utils.unwrap_model`` plus torch DDP), for checkpoints.

In an unwrapped ``GPTModel`` (and the other ``LanguageModule`` s):

* ``decoder.layers``: the ``ModuleList`` of ``TransformerLayer`` s of this chunk.
  Each layer carries ``layer_number``, 1-based and global across pipeline stages and
  virtual chunks, so it names the same layer on every rank that holds it;
* ``embedding``: ``LanguageModelEmbedding`` (word and position embeddings), only on
  the first pipeline stage (``pre_process``);
* ``output_layer``: the LM head, a ``ColumnParallelLinear``, only on the last stage
  (``post_process``). With ``share_embeddings_and_output_weights`` it allocates no
  weight (``output_layer.weight is None``) and forward passes it the embedding's
  ``word_embeddings.weight``: replaying it needs that weight passed in.
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
    """The unwrapped chunk."""
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
