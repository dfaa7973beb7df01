"""Timing pools and the pair's own history: naming a straggler where values have two copies.

A timing comparison needs only the same *work*, not the same values: :func:`work_key` digests
what makes two replays cost the same, :func:`pool_classes` and :func:`excluded` keep other work
out, :class:`OwnHistory` judges a pair by each rank's own history. Contract: all is pure and fed
alike on every rank. Rules: docs/replay.md, "Timing pools: equal work, not equal values".
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HISTORY",
    "HISTORY_MIN",
    "OwnHistory",
    "PairCall",
    "PoolTiming",
    "excluded",
    "pool_classes",
    "slower",
    "work_key",
]

HISTORY = 16
"""Clean rounds of one series kept per rank (median): bounded, like every history."""
HISTORY_MIN = 2
"""Clean rounds a rank needs before its own history judges it."""


def work_key(
    *,
    kind: str,
    module_class: str,
    params: Iterable[tuple[str, Sequence[int]]],
    inputs: Iterable[Any],
    device: str,
) -> int:
    """A nonzero 63-bit digest of the work one replay round does.

    ``params`` is (dtype, shape) per parameter in order, without names (pipeline stages name
    the same block differently); ``inputs`` the captured call's leaf metadata."""
    text = json.dumps(
        {
            "kind": kind,
            "class": module_class,
            "params": [[str(d), list(s)] for d, s in params],
            "inputs": list(inputs),
            "device": device,
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    word = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return (word >> 1) or 1


@dataclass(frozen=True)
class PoolTiming:
    """One round's timing pool as every member saw it: the layout's pool (ascending),
    each member's work key (None: it replayed nothing) and its ``t_M`` (None: missing)."""

    ranks: tuple[int, ...]
    keys: tuple[int | None, ...]
    times: tuple[float | None, ...]
    asking: tuple[bool, ...] = ()
    """Each member's referee flag (:mod:`scout_core.replay.referee`): its peer group
    disagrees on a computed surface with equal inputs and parameters."""

    def time_of(self, rank: int) -> float | None:
        return self.times[self.ranks.index(rank)]


def pool_classes(pool: PoolTiming) -> list[tuple[int, ...]]:
    """The pool split by work key, largest class first (ties: the one holding the lowest
    rank); members without a key or a time are in none."""
    by_key: dict[int, list[int]] = {}
    for r, k, t in zip(pool.ranks, pool.keys, pool.times, strict=True):
        if k is not None and t is not None:
            by_key.setdefault(k, []).append(r)
    return sorted((tuple(c) for c in by_key.values()), key=lambda c: (-len(c), c[0]))


def excluded(pool: PoolTiming) -> dict[int, str]:
    """Ranks outside the largest key class (:func:`pool_classes`), each with the reason."""
    classes = pool_classes(pool)
    main = set(classes[0]) if classes else set()
    out: dict[int, str] = {}
    for r, k, t in zip(pool.ranks, pool.keys, pool.times, strict=True):
        if r in main:
            continue
        if k is None or t is None:
            out[r] = "replayed nothing this round (not ready, or its timing is missing)"
        else:
            out[r] = (
                f"replays work key {k:016x}, not the pool's "
                f"{pool.keys[pool.ranks.index(classes[0][0])]:016x}"
            )
    return out


def slower(value: float, reference: float, *, min_excess_s: float, min_ratio: float) -> bool:
    """The straggler thresholds: ``value`` exceeds ``reference`` by both."""
    return value - reference >= min_excess_s and (reference <= 0 or value / reference >= min_ratio)


@dataclass(frozen=True)
class PairCall:
    """What one round of a pair decided (:meth:`OwnHistory.judge`)."""

    named: int | None
    """The rank confirmed slow (``rounds`` consecutive rounds), else None."""
    joint: bool
    """Both ranks slower than their own history for ``rounds`` rounds, first seen now."""
    medians: dict[int, float]
    """Each rank's own-history median this round (absent: no history yet)."""


class OwnHistory:
    """Recent clean rounds per rank and timing series, and the pair rule (fed alike everywhere)."""

    def __init__(self, *, rounds: int, min_excess_s: float, min_ratio: float) -> None:
        self.rounds = rounds
        self.min_excess_s = min_excess_s
        self.min_ratio = min_ratio
        self._base: dict[tuple[str, int], deque[float]] = {}
        self._streak: dict[tuple[str, int], int] = {}
        self._joint: dict[tuple[str, tuple[int, int]], int] = {}

    def _slower(self, value: float, reference: float) -> bool:
        return slower(value, reference, min_excess_s=self.min_excess_s, min_ratio=self.min_ratio)

    def median(self, series: str, rank: int) -> float | None:
        """``rank``'s own-history median of ``series``, once it has enough rounds."""
        base = self._base.get((series, rank))
        if base is None or len(base) < HISTORY_MIN:
            return None
        return statistics.median(base)

    def judge(self, series: str, pair: tuple[tuple[int, float], tuple[int, float]]) -> PairCall:
        """One round of ``series`` for the two ranks and their ``t_M`` (module doc)."""
        (ra, ta), (rb, tb) = pair
        key = (min(ra, rb), max(ra, rb))
        ma, mb = self.median(series, ra), self.median(series, rb)
        medians = {r: m for r, m in ((ra, ma), (rb, mb)) if m is not None}
        slow_a = ma is not None and self._slower(ta, ma)
        slow_b = mb is not None and self._slower(tb, mb)
        # Only a rank's clean rounds form its history, so a slow rank stays visible.
        for r, t, slow in ((ra, ta, slow_a), (rb, tb, slow_b)):
            if not slow:
                self._base.setdefault((series, r), deque(maxlen=HISTORY)).append(t)
        judged = ma is not None and mb is not None
        joint = judged and slow_a and slow_b
        streak = self._joint[(series, key)] = self._joint.get((series, key), 0) + 1 if joint else 0
        named: int | None = None
        for r, t, slow, t_other, slow_other in (
            (ra, ta, slow_a, tb, slow_b),
            (rb, tb, slow_b, ta, slow_a),
        ):
            counts = judged and slow and not slow_other and self._slower(t, t_other)
            n = self._streak[(series, r)] = self._streak.get((series, r), 0) + 1 if counts else 0
            if n >= self.rounds:
                named = r
        return PairCall(named, streak == self.rounds, medians)
