"""The C3 decision rule (paper §5, Algorithm 1) as pure functions.

Contract: the functions are pure and deterministic, so every peer derives the same ``(status,
bitmap)`` from the same gathered evidence without a coordinator. :func:`decide_exact` needs a
*strict* majority (else inconclusive, all-zero bitmap); :func:`decide_statistical` flags
``|τ_j - m| > κ·d``, ``d`` from :func:`robust_scale` (unscaled MAD). docs/concepts.md, "C3".
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from scout_core.vocabulary import Status

__all__ = ["Decision", "decide_exact", "decide_statistical", "robust_scale"]


@dataclass(frozen=True)
class Decision:
    """A status and an N-bit bitmap: ``bitmap[j]`` iff peer ``j`` is attributed (all false
    unless ``status`` is ``ATTRIBUTED``)."""

    status: Status
    bitmap: tuple[bool, ...]


def _quiet(n: int, status: Status) -> Decision:
    return Decision(status, (False,) * n)


def decide_exact(values: Sequence[Hashable]) -> Decision:
    """Strict-majority consensus: with ``v*`` the most frequent value and ``c*`` its count,
    ``c* ≤ N/2`` is inconclusive (all-zero bitmap), else peers not holding ``v*`` are flagged.
    ``ValueError`` for an empty group; one peer trivially agrees."""
    n = len(values)
    if n == 0:
        raise ValueError("C3 needs at least one peer value, got none")
    if values.count(values[0]) == n:  # the healthy path, at C speed
        return _quiet(n, Status.AGREE)
    # First value reaching the top count: a tie never exceeds N/2, but stays deterministic.
    counts: dict[Hashable, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    winner, top = next(iter(counts.items()))
    for v, c in counts.items():
        if c > top:
            winner, top = v, c
    if 2 * top <= n:  # c* ≤ N/2, in integers
        return _quiet(n, Status.INCONCLUSIVE)
    bitmap = tuple(v != winner for v in values)
    return Decision(Status.ATTRIBUTED if any(bitmap) else Status.AGREE, bitmap)


def _median_sorted(xs: Sequence[float]) -> float:
    """Median of an already sorted, non-empty sequence (mean of the middle pair for even N)."""
    n = len(xs)
    mid = n // 2
    if n % 2:
        return float(xs[mid])
    return (xs[mid - 1] + xs[mid]) / 2.0


def robust_scale(values: Sequence[float]) -> float:
    """The robust dispersion ``d`` of statistical C3: the unscaled MAD ``median_i |τ_i - m|``;
    if 0, the inner IQR ``x[floor(0.75·(N-1))] - x[ceil(0.25·(N-1))]`` (0 when N ≤ 2); if 0
    too, ``(max - min) / (2·N)``. Zero only when every value is equal. Raises ``ValueError``
    for an empty sequence or a non-finite value. Why these fallbacks: docs/concepts.md, "C3"."""
    n = len(values)
    if n == 0:
        raise ValueError("robust_scale needs at least one value, got none")
    xs = sorted(float(v) for v in values)
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"robust_scale needs finite values, got {list(values)!r}")
    m = _median_sorted(xs)
    mad = _median_sorted(sorted(abs(x - m) for x in xs))
    if mad > 0.0:
        return mad
    lo = math.ceil(0.25 * (n - 1))
    hi = math.floor(0.75 * (n - 1))
    iqr = xs[hi] - xs[lo] if hi > lo else 0.0
    if iqr > 0.0:
        return iqr
    spread = xs[-1] - xs[0]
    scaled = spread / (2 * n)
    # A subnormal spread can underflow to 0; only an all-equal group may have zero scale.
    return scaled if scaled > 0.0 else spread


def decide_statistical(values: Sequence[float], kappa: float) -> Decision:
    """Robust outlier rule for timings: flag ``|τ_j - m| > κ·d`` (``m`` the median, ``d`` from
    :func:`robust_scale`; ``d = 0`` agrees); a fleet-wide slowdown moves ``m`` and flags no one
    (paper §5). A non-finite timing is inconclusive with an all-zero bitmap (fail closed).
    ``ValueError`` for an empty group or a ``kappa`` that is not finite and positive."""
    if not (isinstance(kappa, (int, float)) and math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"kappa must be a finite number > 0, got {kappa!r}")
    n = len(values)
    if n == 0:
        raise ValueError("C3 needs at least one peer value, got none")
    taus = [float(v) for v in values]
    if not all(math.isfinite(t) for t in taus):
        return _quiet(n, Status.INCONCLUSIVE)
    d = robust_scale(taus)
    if d == 0.0:
        return _quiet(n, Status.AGREE)
    m = _median_sorted(sorted(taus))
    limit = kappa * d
    bitmap = tuple(abs(t - m) > limit for t in taus)
    return Decision(Status.ATTRIBUTED if any(bitmap) else Status.AGREE, bitmap)
