"""When each replay recipe runs, which target it samples, and the recipe catalog.

Contract: every answer is a pure function of the step number and the configuration, so every
rank decides the same recipes at the same step without talking (readiness C3 then only
confirms that every peer captured them). Each recipe kind is a :class:`Track` with its own
interval ``I`` and phase, due when ``step % I == phase`` and rotating over its targets; with
``spread`` on, the phases are placed so that no step runs two recipes unless the intervals
leave no free phase. :attr:`Schedule.catalog` lists every distinct check once; its size ``K``
is the checkpoint gate's recipe cycle, and the amortised cost ``V/(I·N)`` is logged at start.
docs/replay.md, "Which recipes are due".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ALL_TO_ALL",
    "EMBEDDING",
    "HIDDEN",
    "LM_HEAD",
    "EXPERTS",
    "OPTIMIZER",
    "ROTATING",
    "ROUTER",
    "SYNTHETIC",
    "Recipe",
    "Schedule",
    "Track",
]

HIDDEN = "hidden"
EMBEDDING = "embedding"
LM_HEAD = "lm_head"
OPTIMIZER = "optimizer"
ROUTER = "router"
"""MoE routers: captured and replayed like any layer (their input has a fixed shape)."""
EXPERTS = "experts"
"""MoE experts at catalog representatives (:mod:`scout_core.replay.experts`)."""
ALL_TO_ALL = "all_to_all"
"""An MoE layer's dispatch and combine all-to-all on SCOUT's EP groups (:mod:`.all_to_all`)."""

ROTATING: set[str] = {HIDDEN, ALL_TO_ALL}
"""Kinds that rotate over interchangeable modules (same shapes, same work): one timing series,
so a straggler streak runs across the rotation; other kinds keep one series per target."""

SYNTHETIC: set[str] = {EXPERTS, ALL_TO_ALL}
"""Recipe kinds whose rounds replay synthetic inputs built from a broadcast seed, not a
capture: their targets are no module paths, and :meth:`Schedule.modules_due` skips them."""


@dataclass(frozen=True)
class Recipe:
    """One check: a recipe kind and what it targets."""

    kind: str
    """``hidden``, ``embedding``, ``lm_head``, ``optimizer`` or an added track's kind."""
    path: str | None
    """Module path for layer recipes; ``None`` for the optimizer."""
    index: int = 0
    """Rotation index: the layer's position, or the optimizer slice number."""

    @property
    def name(self) -> str:
        """Surface prefix in evidence: ``layer/<path>``, ``optimizer``, or for a
        :data:`SYNTHETIC` kind ``<kind>/<target>`` (``experts/layers.0.moe.experts@rows=7``)."""
        if self.path is None:
            return "optimizer"
        return f"{self.kind}/{self.path}" if self.kind in SYNTHETIC else f"layer/{self.path}"

    @property
    def series(self) -> str:
        """The timing series of this recipe's rounds, which keeps its own straggler streaks
        and broadcast baselines (:data:`ROTATING` kinds share one series per kind)."""
        if self.kind in ROTATING or self.path is None:
            return self.kind
        return f"{self.kind}:{self.path}"


@dataclass(frozen=True)
class Track:
    """One recipe kind in the schedule: its interval and what it rotates over."""

    kind: str
    interval: int
    targets: tuple[str | None, ...]
    """Module paths in rotation order (``(None,)`` for the optimizer's slices)."""


def place_phases(intervals: Sequence[int], *, spread: bool = True) -> list[int]:
    """A phase per track (see docs/replay.md): the first keeps ``I - 1``; with ``spread``
    each later one takes the free phase nearest its evenly spaced ideal, or the ideal
    itself when the intervals leave none free."""
    phases: list[int] = []
    m = len(intervals)
    for j, interval in enumerate(intervals):
        last = interval - 1
        if not spread or j == 0:
            phases.append(last)
            continue
        ideal = (last - (j * interval) // m) % interval

        def meets(p: int, interval: int = interval) -> int:
            return sum(
                (p - q) % math.gcd(interval, other) == 0
                for q, other in zip(phases, intervals, strict=False)
            )

        # Nearest to the ideal among the phases meeting the fewest earlier tracks (none,
        # when the intervals leave one free).
        order = sorted(
            range(interval),
            key=lambda p: (meets(p), min((p - ideal) % interval, (ideal - p) % interval)),
        )
        phases.append(order[0])
    return phases


class Schedule:
    """The per-recipe cadence and rotation of one job (identical on every rank)."""

    def __init__(
        self,
        *,
        layers: Sequence[str],
        embedding: str | None,
        lm_head: str | None,
        optimizer: bool,
        intervals: Mapping[str, int],
        recipes: Sequence[str],
        variants: int,
        spread: bool = True,
        tracks: Sequence[Track] = (),
    ) -> None:
        self.layers = tuple(layers)
        self.embedding = embedding if EMBEDDING in recipes else None
        self.lm_head = lm_head if LM_HEAD in recipes else None
        self.hidden = HIDDEN in recipes and bool(self.layers)
        self.optimizer = optimizer and OPTIMIZER in recipes
        for kind in (HIDDEN, EMBEDDING, LM_HEAD, OPTIMIZER):
            if intervals.get(kind, 1) < 1:
                raise ValueError(f"interval of recipe {kind!r} must be >= 1")
        self.intervals = {
            k: int(intervals.get(k, 1)) for k in (HIDDEN, EMBEDDING, LM_HEAD, OPTIMIZER)
        }
        self.variants = max(1, int(variants))
        self.spread = spread
        active: list[Track] = []
        if self.hidden:
            active.append(Track(HIDDEN, self.intervals[HIDDEN], self.layers))
        if self.embedding is not None:
            active.append(Track(EMBEDDING, self.intervals[EMBEDDING], (self.embedding,)))
        if self.lm_head is not None:
            active.append(Track(LM_HEAD, self.intervals[LM_HEAD], (self.lm_head,)))
        if self.optimizer:
            active.append(Track(OPTIMIZER, self.intervals[OPTIMIZER], (None,)))
        for track in tracks:
            if track.interval < 1 or not track.targets:
                raise ValueError(f"track {track.kind!r} needs an interval >= 1 and targets")
            if any(t.kind == track.kind for t in active):
                raise ValueError(f"recipe kind {track.kind!r} is scheduled twice")
            active.append(track)
            self.intervals[track.kind] = track.interval
        self.tracks = tuple(active)
        self.phases = dict(
            zip(
                (t.kind for t in active),
                place_phases([t.interval for t in active], spread=spread),
                strict=True,
            )
        )
        self._every = tuple(sorted({(t.interval, self.phases[t.kind]) for t in active}))

    @property
    def catalog(self) -> tuple[Recipe, ...]:
        """Every distinct check once: layers, embedding, LM head, optimizer, added tracks."""
        out: list[Recipe] = []
        for track in self.tracks:
            out.extend(Recipe(track.kind, p, i) for i, p in enumerate(track.targets))
        return tuple(out)

    @property
    def catalog_size(self) -> int:
        """``K``: the checks in one full rotation of the catalog."""
        return len(self.catalog)

    def _round(self, kind: str, step: int) -> int | None:
        """The 0-based round of ``kind`` due at ``step``, or None when it is not due."""
        interval, phase = self.intervals[kind], self.phases[kind]
        if step % interval != phase:
            return None
        return (step - phase) // interval

    def any_due(self, step: int) -> bool:
        """Whether any recipe is due at ``step``: the healthy path's only per-step check."""
        return any(step % i == p for i, p in self._every)

    def due(self, step: int, *, optimizer_slices: int = 1) -> list[Recipe]:
        """The recipes due at the replay boundary of iteration ``step`` (0-based)."""
        out: list[Recipe] = []
        for track in self.tracks:
            r = self._round(track.kind, step)
            if r is None:
                continue
            if track.kind == OPTIMIZER:
                out.append(Recipe(OPTIMIZER, None, r % max(1, optimizer_slices)))
            else:
                i = r % len(track.targets)
                out.append(Recipe(track.kind, track.targets[i], i))
        return out

    def modules_due(self, step: int) -> set[str]:
        """Module paths to capture during iteration ``step`` (none for :data:`SYNTHETIC`)."""
        return {r.path for r in self.due(step) if r.path is not None and r.kind not in SYNTHETIC}

    def overhead_estimate(self) -> float:
        """The paper's amortised layer-equivalent cost ``V/(I·N)`` of hidden-layer replay."""
        if not self.hidden:
            return 0.0
        return self.variants / (self.intervals[HIDDEN] * len(self.layers))

    def most_per_step(self, horizon: int | None = None) -> int:
        """The most recipes any step runs (over one period of the tracks, or ``horizon``)."""
        period = math.lcm(*(t.interval for t in self.tracks)) if self.tracks else 1
        steps = min(period + max(self.phases.values(), default=0), horizon or 10**6)
        return max((len(self.due(s)) for s in range(steps)), default=0)
