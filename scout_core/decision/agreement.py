"""What ranks agree on, in one place: min/max of a step, all-ok, any-flag, same value.

Contract: each answer is one int64 ``MAX`` reduction (:func:`reduce_max`) on a group SCOUT
created, never ``WORLD`` or a training group, and every rank gets the same answer. Why:
docs/internals.md, "Agreement: one reduction, every rank the same branch".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from scout_core.topology.groups import is_diagnostic

__all__ = [
    "GATHER_WORDS",
    "all_gather_single",
    "all_ok",
    "any_flag",
    "check_group",
    "digest",
    "min_max",
    "reduce_max",
    "same_value",
]


def check_group(group: object) -> dist.ProcessGroup:
    """``group`` if SCOUT created it; :class:`ValueError` for ``WORLD``, None or a foreign group."""
    if group is None or group == dist.group.WORLD:
        raise ValueError("SCOUT agrees on a diagnostic group, never WORLD")
    if not is_diagnostic(group):
        raise ValueError(
            "SCOUT agrees only on groups it created (diagnostic_group or its peer groups), "
            "never on a training group"
        )
    assert isinstance(group, dist.ProcessGroup)
    return group


GATHER_WORDS = 1 << 16
"""Most words (ranks x words) :func:`reduce_max` gathers, not all-reduces (512 KiB per rank)."""


def all_gather_single() -> Any:
    """``all_gather_single`` where torch has it (2.13 deprecates ``all_gather_into_tensor``
    with a ``FutureWarning`` per call); looked up per call so tests can patch it."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_max(words: Sequence[int], group: dist.ProcessGroup) -> list[int]:
    """Element-wise int64 maximum of ``words`` over ``group``: one collective."""
    pg = check_group(group)
    tensor = torch.tensor(list(words), dtype=torch.int64)
    size = dist.get_world_size(pg)
    if tensor.numel() > 0 and size * tensor.numel() <= GATHER_WORDS:
        everyone = torch.empty(size * tensor.numel(), dtype=torch.int64)
        all_gather_single()(everyone, tensor, group=pg)
        return [int(w) for w in everyone.view(size, -1).amax(0).tolist()]
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=pg)
    return [int(w) for w in tensor.tolist()]


def min_max(value: int, group: dist.ProcessGroup) -> tuple[int, int]:
    """The smallest and the largest ``value`` any rank of ``group`` passed."""
    hi, neg_lo = reduce_max([value, -value], group)
    return -neg_lo, hi


def all_ok(ok: bool, groups: dist.ProcessGroup | Sequence[dist.ProcessGroup]) -> bool:
    """Whether every rank passed ``ok=True``; several groups are folded in turn, covering
    every rank reachable through them (HSDP: shard then replica group). All must call it."""
    chain = [groups] if isinstance(groups, dist.ProcessGroup) else list(groups)
    flag = 0 if ok else 1
    for g in chain:
        (flag,) = reduce_max([flag], g)
    return flag == 0


def any_flag(flag: bool, group: dist.ProcessGroup) -> bool:
    """Whether any rank of ``group`` passed ``flag=True``."""
    (found,) = reduce_max([1 if flag else 0], group)
    return found == 1


def digest(value: object) -> int:
    """A stable 62-bit digest of ``repr(value)`` (non-negative: it fits the MAX words)."""
    raw = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 2


def same_value(value: object, group: dist.ProcessGroup) -> bool:
    """Whether every rank of ``group`` passed an equal ``value`` (compared by :func:`digest`)."""
    lo, hi = min_max(digest(value), group)
    return lo == hi
