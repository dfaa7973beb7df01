"""What a layer round's readiness digest covers, and the referee's version of it.

Contract: :func:`readiness_fields` lists what peers must agree on before a round moves any
payload; :func:`digest_of` is its 64-bit digest. :func:`referee_fields` is the same without the
module path (the recipe kind and the module's class instead): what a referee checks a shipment
against, so one in another pipeline stage can take it. Docs: docs/replay.md, "One round, step
by step" and "Referee replay".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from scout_core.integration.adapter import ModuleRef
from scout_core.replay.capture import Capture
from scout_core.replay.schedule import Recipe

__all__ = ["digest_of", "leaf_meta", "readiness_fields", "referee_fields"]


def leaf_meta(x: Any) -> Any:
    """A call leaf's metadata: a tensor's dtype and shape, a plain value's repr, else its type."""
    if isinstance(x, torch.Tensor):
        return ["T", str(x.dtype), list(x.shape)]
    if x is None or isinstance(x, bool | int | float | str):
        return ["V", repr(x)]
    return ["O", type(x).__qualname__]


def digest_of(obj: Any) -> int:
    """A 64-bit blake2b of ``obj``'s canonical JSON."""
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def readiness_fields(
    recipe: Recipe,
    step: int,
    ref: ModuleRef,
    cap: Capture,
    *,
    variants: Sequence[float],
    stack: str,
) -> dict[str, Any]:
    """What a round's readiness digest covers: the recipe (its module path included), the
    step, the call's structure, dtypes and shapes, the masks, the RNG streams, the
    parameters, the input variants and the software stack."""
    params = [
        [n, str(p.dtype), list(p.shape), p.requires_grad] for n, p in ref.module.named_parameters()
    ]
    return {
        "recipe": recipe.name,
        "step": step,
        "capture": cap.step,
        "leaves": [leaf_meta(x) for x in cap.leaves],
        "rg": list(cap.requires_grad),
        "out_rg": list(cap.out_requires_grad),
        "grads": [leaf_meta(g) for g in cap.grads],
        "rng": sorted([k, list(v.shape)] for k, v in cap.rng.items()),
        "params": params,
        "variants": [float(v).hex() for v in variants],
        "stack": stack,
    }


def referee_fields(fields: Mapping[str, Any], recipe: Recipe, ref: ModuleRef) -> dict[str, Any]:
    """The readiness fields a referee checks a shipment against (module doc): a referee in
    another pipeline stage, whose blocks have other paths, takes the pair's round when its own
    replayed the same work."""
    module = type(ref.module)
    return {**fields, "recipe": [recipe.kind, f"{module.__module__}.{module.__qualname__}"]}
