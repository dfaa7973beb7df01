"""What a checkpoint on disk may claim, checked before anything is allocated or applied.

A shard may be tampered with and its checksums rewritten, which sha256 cannot catch.
Contract: every field that steers the loader is checked here, locally, before any
collective payload (paths stay inside the generation, sizes within the checkpoint's own
totals, types checked, nesting bounded); every problem is a
:class:`~scout_core.errors.CheckpointError`. Docs: docs/checkpoint_gate.md, "Restoring atomically".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from scout_core.errors import CheckpointError

__all__ = [
    "MAX_DEPTH",
    "check_dcp_metadata",
    "check_int",
    "dtype_named",
    "inside",
    "plain_name",
    "skeleton_specs",
    "specs_nbytes",
]

MAX_DEPTH = 64
"""Deepest skeleton a gate checkpoint may hold (real training state is < 10 deep)."""
_MAX_DIMS = 16
_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9._-]{0,254}$")
_DTYPES = {
    str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)
}
"""Every dtype this torch has, by the name a checkpoint stores (``float32``)."""

Spec = tuple[torch.dtype, tuple[int, ...]]


def check_int(value: object, what: str, *, low: int = 0, high: int = 1 << 62) -> int:
    """``value`` if it is an integer in ``low..high`` (never a bool, str or float)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"{what} must be an integer in {low}..{high}, got {value!r:.60}")
    return value


def plain_name(name: object, what: str) -> str:
    """``name`` if it is one plain path component (no separator, not ``.``/``..``)."""
    if not isinstance(name, str) or not _NAME.match(name) or name in {".", ".."}:
        raise CheckpointError(f"{what} {name!r:.80} is not a plain file name")
    return name


def inside(path: Path, root: Path, what: str) -> Path:
    """``path`` if, with symlinks resolved, it lies under ``root``; else CheckpointError."""
    resolved, top = path.resolve(), root.resolve()
    if resolved != top and top not in resolved.parents:
        raise CheckpointError(f"{what} {path} points outside {root} (to {resolved})")
    return path


def dtype_named(name: object) -> torch.dtype:
    """The dtype a checkpoint names (``"float32"``); :class:`CheckpointError` for anything else."""
    if not isinstance(name, str) or name not in _DTYPES:
        raise CheckpointError(f"unknown tensor dtype {name!r:.40} in checkpoint metadata")
    return _DTYPES[name]


def _shape(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > _MAX_DIMS:
        raise CheckpointError(f"{what} must be a list of at most {_MAX_DIMS} sizes")
    return tuple(check_int(n, f"{what} entry") for n in value)


def specs_nbytes(specs: Mapping[str, Spec]) -> int:
    """Total bytes of the tensors ``specs`` describe."""
    return sum(
        math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        for dtype, shape in specs.values()
    )


def skeleton_specs(skeleton: object) -> dict[str, Spec]:
    """``{key: (dtype, local shape)}`` of a skeleton's tensors, all of it checked iteratively."""
    out: dict[str, Spec] = {}
    stack: list[tuple[object, int]] = [(skeleton, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise CheckpointError(f"checkpoint skeleton nested deeper than {MAX_DEPTH}")
        if not isinstance(node, dict) or len(node) == 0:
            raise CheckpointError(f"malformed checkpoint skeleton node {node!r:.80}")
        if "T" in node or "S" in node:
            key = node.get("T", node.get("S"))
            if not isinstance(key, str) or key in out:
                raise CheckpointError(f"checkpoint skeleton names tensor {key!r:.80} badly")
            local = "shape" if "T" in node else "local_shape"
            out[key] = (dtype_named(node.get("dtype")), _shape(node.get(local), f"{key} {local}"))
            if "S" in node:
                _shape(node.get("shape"), f"{key} shape")
                _shape(node.get("stride"), f"{key} stride")
                if not isinstance(node.get("placements"), str):
                    raise CheckpointError(f"{key}: placements must be a string")
        elif "d" in node:
            items = node["d"]
            if not isinstance(items, list):
                raise CheckpointError("checkpoint skeleton dict node must hold a list")
            for item in items:
                if (
                    not isinstance(item, list)
                    or len(item) != 2
                    or isinstance(item[0], bool)
                    or not isinstance(item[0], str | int)
                ):
                    raise CheckpointError(f"malformed checkpoint skeleton entry {item!r:.80}")
                stack.append((item[1], depth + 1))
        elif "l" in node or "t" in node:
            items = node.get("l", node.get("t"))
            if not isinstance(items, list):
                raise CheckpointError("checkpoint skeleton list node must hold a list")
            stack.extend((v, depth + 1) for v in items)
        elif "v" in node:
            value = node["v"]
            if not (value is None or isinstance(value, bool | int | str)) and not (
                isinstance(value, float) and math.isfinite(value)
            ):
                raise CheckpointError(f"checkpoint value {value!r:.80} is not a JSON scalar")
        else:
            raise CheckpointError(f"malformed checkpoint skeleton node {node!r:.80}")
    return out


def check_dcp_metadata(
    data: object, *, files: Mapping[str, int], specs: Mapping[str, Spec], where: Path
) -> None:
    """Check one shard's JSON DCP metadata against its description: exactly the tensors of
    ``specs`` (same dtype and size), only byte ranges inside ``files`` (name → bytes on
    disk), and every chunk inside its tensor."""
    if not isinstance(data, dict):
        raise CheckpointError(f"DCP metadata {where} is not an object")
    tensors, storage = data.get("tensors"), data.get("storage")
    if not isinstance(tensors, dict) or not isinstance(storage, list):
        raise CheckpointError(f"DCP metadata {where} lacks its tensors or storage")
    if set(tensors) != set(specs):
        raise CheckpointError(f"DCP metadata {where} names other tensors than the shard")
    for fqn, entry in tensors.items():
        dtype, shape = specs[fqn]
        if not isinstance(entry, dict) or dtype_named(entry.get("dtype")) != dtype:
            raise CheckpointError(f"DCP metadata {where}: {fqn} has another dtype")
        if _shape(entry.get("size"), f"{fqn} size") != shape:
            raise CheckpointError(f"DCP metadata {where}: {fqn} has another size")
        chunks = entry.get("chunks")
        if not isinstance(chunks, list):
            raise CheckpointError(f"DCP metadata {where}: {fqn} chunks must be a list")
        for chunk in chunks:
            if not isinstance(chunk, dict):
                raise CheckpointError(f"DCP metadata {where}: {fqn} has a malformed chunk")
            offsets = _shape(chunk.get("offsets"), f"{fqn} chunk offsets")
            sizes = _shape(chunk.get("sizes"), f"{fqn} chunk sizes")
            if len(offsets) != len(shape) or len(sizes) != len(shape):
                raise CheckpointError(f"DCP metadata {where}: {fqn} chunk has other dims")
            if any(o + n > d for o, n, d in zip(offsets, sizes, shape, strict=True)):
                raise CheckpointError(f"DCP metadata {where}: {fqn} chunk lies outside it")
    for item in storage:
        if not isinstance(item, dict) or item.get("fqn") not in specs:
            raise CheckpointError(f"DCP metadata {where}: a storage entry names no tensor")
        name = plain_name(item.get("path"), f"DCP metadata {where}: storage file")
        if name not in files:
            raise CheckpointError(
                f"DCP metadata {where} reads {name!r}, which the shard description does not list"
            )
        start = check_int(item.get("file_offset"), f"{where}: file_offset")
        length = check_int(item.get("length"), f"{where}: length")
        if start + length > files[name]:
            raise CheckpointError(
                f"DCP metadata {where}: bytes {start}..{start + length} of {name} lie beyond "
                f"its {files[name]} bytes"
            )
        check_int(item.get("index", 0) or 0, f"{where}: index")
        if item.get("offset") is not None:
            _shape(item.get("offset"), f"{where}: offset")
        if item.get("transforms") not in (None, []):
            raise CheckpointError(f"DCP metadata {where}: storage transforms are not allowed")
