"""A state tree as a JSON skeleton and a flat ``{key: tensor}`` map, and back.

Contract: :func:`flatten` splits a tree of tensors, :class:`~.state.HostShard` leaves,
dicts (str or int keys), lists, tuples and JSON scalars into a skeleton that JSON can
hold and the tensors by path; :func:`unflatten` is its inverse. Nothing is pickled, and
anything else raises :class:`~scout_core.errors.CheckpointError` naming its path. The
in-memory store, peer replication and the durable store all store trees this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from scout_core.checkpoint.state import HostShard, dtype_name
from scout_core.errors import CheckpointError

__all__ = ["flatten", "unflatten"]


def flatten(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``tree`` into a JSON-safe skeleton and ``{path: host tensor}``; dict keys keep
    their type (optimizer state is keyed by int), tuples stay tuples."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(value: Any, path: str) -> Any:
        if isinstance(value, HostShard):
            tensors[path] = value.local
            return {
                "S": path,
                "dtype": dtype_name(value.local.dtype),
                "local_shape": list(value.local.shape),
                "shape": list(value.shape),
                "stride": list(value.stride),
                "placements": value.placements,
            }
        if isinstance(value, torch.Tensor):
            tensors[path] = value
            return {"T": path, "dtype": dtype_name(value.dtype), "shape": list(value.shape)}
        if isinstance(value, Mapping):
            items = []
            for k, v in value.items():
                if isinstance(k, bool) or not isinstance(k, str | int):
                    raise CheckpointError(f"{path}: dict key {k!r} is neither str nor int")
                items.append([k, enc(v, f"{path}/{k}")])
            return {"d": items}
        if isinstance(value, list):
            return {"l": [enc(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, tuple):
            return {"t": [enc(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if value is None or isinstance(value, bool | int | float | str):
            return {"v": value}
        raise CheckpointError(
            f"{path}: cannot store a {type(value).__name__} in a gate checkpoint "
            "(tensors and JSON values only)"
        )

    return enc(tree, "state"), tensors


def unflatten(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`."""

    def dec(node: Any) -> Any:
        if not isinstance(node, dict) or len(node) == 0:
            raise CheckpointError(f"malformed checkpoint skeleton node {node!r:.80}")
        try:
            if "T" in node:
                return tensors[node["T"]]
            if "S" in node:
                return HostShard(
                    local=tensors[node["S"]],
                    shape=tuple(node["shape"]),
                    stride=tuple(node["stride"]),
                    placements=str(node["placements"]),
                )
            if "d" in node:
                return {k: dec(v) for k, v in node["d"]}
            if "l" in node:
                return [dec(v) for v in node["l"]]
            if "t" in node:
                return tuple(dec(v) for v in node["t"])
            if "v" in node:
                return node["v"]
        except KeyError as exc:
            raise CheckpointError(f"checkpoint is missing tensor {exc}") from None
        raise CheckpointError(f"malformed checkpoint skeleton node {node!r:.80}")

    return dec(skeleton)
