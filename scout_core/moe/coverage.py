"""Shape coverage (paper §6.2): which admitted expert shapes online replay may skip.

Contract: ``a`` covers ``b`` iff their fingerprints are equal and ``a``'s path counts are
componentwise at least ``b``'s; the maximal count vectors of each fingerprint class, one
shape each, are exactly the minimum cover; an uncertain shape represents itself. The rule
and its proof: docs/moe.md, "The coverage rule".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Cover", "Profile", "covers", "minimum_cover", "verify_cover"]


@dataclass(frozen=True, slots=True)
class Profile:
    """How one shape executes: fingerprint ``F``, path names and path-count vector ``c``."""

    fingerprint: str | None
    """The kernel and scheduling configuration; ``None`` when it could not be determined."""
    paths: tuple[str, ...] = ()
    counts: tuple[int, ...] | None = None
    """How many times the shape runs each of :attr:`paths`; ``None`` when unknown."""
    note: str = ""
    """Why the profile is uncertain (empty when it is certain)."""

    def __post_init__(self) -> None:
        if self.counts is not None:
            if len(self.counts) != len(self.paths):
                raise ValueError(
                    f"{len(self.counts)} path counts for {len(self.paths)} paths {self.paths}"
                )
            if any((not isinstance(c, int)) or c < 0 for c in self.counts):
                raise ValueError(f"path counts must be non-negative integers, got {self.counts}")

    @property
    def certain(self) -> bool:
        """Both the fingerprint and the path counts are known."""
        return self.fingerprint is not None and self.counts is not None


def covers(a: Profile, b: Profile) -> bool:
    """``a >= b``: same fingerprint and ``a``'s count vector is no smaller anywhere.

    An uncertain profile covers nothing and is covered by nothing, not even an equal one.
    """
    if not (a.certain and b.certain) or a.fingerprint != b.fingerprint:
        return False
    if a.paths != b.paths:
        raise ValueError(
            f"fingerprint {a.fingerprint!r} names different paths {a.paths} and {b.paths}: "
            "the profiler must give one path vocabulary per fingerprint"
        )
    assert a.counts is not None and b.counts is not None
    return all(x >= y for x, y in zip(a.counts, b.counts, strict=True))


@dataclass(frozen=True, slots=True)
class Cover:
    """A set of representatives and, for every shape, the representative covering it."""

    representatives: tuple[int, ...]
    """Indices of the retained shapes, ascending."""
    covered_by: tuple[int, ...]
    """``covered_by[i]`` covers shape ``i`` (a representative covers itself)."""


def _dominates(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True))


def minimum_cover(profiles: Sequence[Profile], prefer: Sequence[float] | None = None) -> Cover:
    """The fewest representatives whose coverage sets contain every shape.

    ``prefer`` breaks ties among equal profiles: the largest value is retained (the catalog
    passes total rows, so the shape doing the most work represents them), then the lowest
    index. ``O(n · |M|)`` per fingerprint class: vectors are visited by decreasing sum, as
    only a vector with a sum at least as large can dominate.
    """
    n = len(profiles)
    if prefer is not None and len(prefer) != n:
        raise ValueError(f"prefer has {len(prefer)} entries for {n} profiles")
    weight = list(prefer) if prefer is not None else [0.0] * n
    covered_by = list(range(n))
    # (fingerprint) -> (vector) -> best index with that vector
    classes: dict[str, dict[tuple[int, ...], int]] = {}
    paths_of: dict[str, tuple[str, ...]] = {}
    for i, p in enumerate(profiles):
        if not p.certain:
            continue  # its own representative
        assert p.fingerprint is not None and p.counts is not None
        known = paths_of.setdefault(p.fingerprint, p.paths)
        if known != p.paths:
            raise ValueError(
                f"fingerprint {p.fingerprint!r} names different paths {known} and {p.paths}"
            )
        best = classes.setdefault(p.fingerprint, {})
        j = best.get(p.counts)
        if j is None or weight[i] > weight[j]:
            best[p.counts] = i
    winner: dict[tuple[str, tuple[int, ...]], int] = {}
    for fp, best in classes.items():
        maxima: list[tuple[int, ...]] = []
        for vec in sorted(best, key=lambda v: (-sum(v), v)):
            top = next((m for m in maxima if _dominates(m, vec)), None)
            if top is None:
                maxima.append(vec)
                top = vec
            winner[(fp, vec)] = best[top]
    for i, p in enumerate(profiles):
        if p.certain:
            assert p.fingerprint is not None and p.counts is not None
            covered_by[i] = winner[(p.fingerprint, p.counts)]
    reps = tuple(sorted(set(covered_by)))
    return Cover(representatives=reps, covered_by=tuple(covered_by))


def verify_cover(profiles: Sequence[Profile], cover: Cover) -> list[str]:
    """Problems with ``cover`` for ``profiles`` (empty: all covered); run on catalog load."""
    problems: list[str] = []
    if len(cover.covered_by) != len(profiles):
        return [f"cover lists {len(cover.covered_by)} shapes, profiles {len(profiles)}"]
    reps = set(cover.representatives)
    for i, (p, r) in enumerate(zip(profiles, cover.covered_by, strict=True)):
        if r not in reps or not 0 <= r < len(profiles):
            problems.append(f"shape {i}: its representative {r} is not retained")
        elif r == i:
            continue
        elif not p.certain:
            problems.append(f"shape {i} is uncertain but is represented by shape {r}")
        elif not covers(profiles[r], p):
            problems.append(f"shape {i} is not covered by its representative {r}")
    for r in reps:
        if not 0 <= r < len(profiles) or cover.covered_by[r] != r:
            problems.append(f"representative {r} does not represent itself")
    return problems
