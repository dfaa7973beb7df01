"""ZeRO-3 support: gather one layer's partitions off the training path, call it hook-free.

Contract: :func:`gather_full` gathers a parameter's ``ds_tensor`` partitions on SCOUT's group,
in ``ds_process_group`` order, into a plain full copy, leaving the live parameter and its ZeRO
status untouched (``GatheredParameters`` would talk on the training communicator).
:func:`without_deepspeed_hooks` hides exactly the ``deepspeed`` package's hooks for one
replayed call. Docs: docs/deepspeed.md, "ZeRO stages: what SCOUT can and cannot see".
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.plugin_api import PeerGroup, injected_delay

__all__ = [
    "gather_full",
    "is_deepspeed_hook",
    "is_partitioned",
    "partition",
    "without_deepspeed_hooks",
]

_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)


def is_partitioned(p: torch.Tensor) -> bool:
    """Whether ``p`` is a ZeRO-3 parameter (it carries a partition ``ds_tensor``)."""
    return getattr(p, "ds_tensor", None) is not None and hasattr(p, "ds_numel")


def is_deepspeed_hook(hook: Any) -> bool:
    """Whether a module hook was registered by DeepSpeed (its code lives in ``deepspeed``)."""
    owner = getattr(hook, "__self__", None)
    if owner is not None and type(owner).__module__.startswith("deepspeed"):
        return True
    try:
        inner = inspect.unwrap(hook)
    except ValueError:  # a wrapper cycle: judge the outer object
        inner = hook
    for fn in (hook, inner):
        where = getattr(fn, "__module__", None) or ""
        if str(where).startswith("deepspeed"):
            return True
    return False


@contextmanager
def without_deepspeed_hooks(module: nn.Module) -> Iterator[None]:
    """Hide DeepSpeed's hooks on ``module`` and its submodules; restore them on exit."""
    saved: list[tuple[nn.Module, str, Any]] = []
    try:
        for sub in module.modules():
            for attr in _HOOK_DICTS:
                hooks = getattr(sub, attr, None)
                if not hooks or not any(is_deepspeed_hook(h) for h in hooks.values()):
                    continue
                kept = type(hooks)((k, h) for k, h in hooks.items() if not is_deepspeed_hook(h))
                saved.append((sub, attr, hooks))
                setattr(sub, attr, kept)
        yield
    finally:
        for sub, attr, hooks in reversed(saved):
            setattr(sub, attr, hooks)


def partition(p: torch.Tensor) -> torch.Tensor:
    """This rank's ZeRO-3 partition of ``p`` (its ``ds_numel`` leading elements)."""
    part: torch.Tensor = p.ds_tensor  # type: ignore[attr-defined]  # ZeRO-3 attribute
    numel = int(getattr(part, "ds_numel", part.numel()))
    return part.detach().reshape(-1)[:numel]


def _group_rank(pg: Any, global_rank: int) -> int:
    return global_rank if pg is None else int(dist.get_group_rank(pg, global_rank))


def gather_full(params: Sequence[tuple[str, torch.Tensor]], group: PeerGroup) -> dict[str, Any]:
    """Full copies of ZeRO-3 parameters, all-gathered on SCOUT's ``group`` (the same ranks as
    each ``ds_process_group``, checked at activation): one all-gather per dtype."""
    out: dict[str, torch.Tensor] = {}
    n = len(group.ranks)
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, p in params:
        if is_partitioned(p):
            by_dtype.setdefault(p.ds_tensor.dtype, []).append((name, p))  # type: ignore[attr-defined]
        else:
            out[name] = p.detach().clone()
    for dtype, items in by_dtype.items():
        parts = [partition(p).cpu() for _, p in items]
        sizes = [t.numel() for t in parts]
        mine = torch.cat(parts) if parts else torch.empty(0, dtype=dtype)
        recv = torch.empty(n * mine.numel(), dtype=dtype)
        delay = injected_delay("shard")  # a test's slow link at this rank; 0.0 in production
        if delay:
            time.sleep(delay)
        dist.all_gather_into_tensor(recv, mine.contiguous(), group=group.pg)
        rows = recv.view(n, -1)
        for i, (name, p) in enumerate(items):
            pg = p.ds_process_group  # type: ignore[attr-defined]  # ZeRO-3 attribute
            # Piece j belongs to rank j of the parameter's own group; rows are in SCOUT's order.
            order = sorted(range(n), key=lambda j: _group_rank(pg, group.ranks[j]))
            start = sum(sizes[:i])
            flat = torch.cat([rows[j, start : start + sizes[i]] for j in order])
            numel = int(p.ds_numel)  # type: ignore[attr-defined]  # ZeRO-3 attribute
            shape = tuple(p.ds_shape)  # type: ignore[attr-defined]  # ZeRO-3 attribute
            out[name] = flat[:numel].reshape(shape).clone().to(partition(p).device)
    return dict(out)
