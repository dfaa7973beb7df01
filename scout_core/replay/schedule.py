"""When each replay recipe runs, which layer it samples, and the recipe catalog.

Replay must cost a small, predictable fraction of training and still cover the
whole model over time. Each recipe (hidden layer, embedding, LM head, optimizer
update) has its own interval ``I``; the hidden-layer recipe rotates through the
repeated layers, one per due step, and the optimizer recipe rotates its slice over
the parameters. Everything here is a pure function of the step number, so every
rank decides the same recipes at the same step without talking to anyone; the
readiness C3 then only has to confirm that every peer actually captured them.

The *catalog* lists every distinct check once: each rotated hidden layer, the
embedding, the LM head and the optimizer. Its size ``K`` is what the checkpoint
gate calls one recipe cycle (a clean check of one layer says nothing about
another). The amortised overhead estimate ``V/(I·N)`` (paper §6) is logged when
SCOUT starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["HIDDEN", "EMBEDDING", "LM_HEAD", "OPTIMIZER", "Recipe", "Schedule"]

HIDDEN = "hidden"
EMBEDDING = "embedding"
LM_HEAD = "lm_head"
OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class Recipe:
    """One check: a recipe kind and what it targets."""

    kind: str
    """``hidden``, ``embedding``, ``lm_head`` or ``optimizer``."""
    path: str | None
    """Module path for layer recipes; ``None`` for the optimizer."""
    index: int = 0
    """Rotation index: the layer's position, or the optimizer slice number."""

    @property
    def name(self) -> str:
        """Surface prefix in evidence: ``layer/<path>`` or ``optimizer``."""
        return "optimizer" if self.path is None else f"layer/{self.path}"


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
        on = {
            HIDDEN: self.hidden,
            EMBEDDING: self.embedding is not None,
            LM_HEAD: self.lm_head is not None,
            OPTIMIZER: self.optimizer,
        }
        self._every = tuple(sorted({self.intervals[k] for k, active in on.items() if active}))

    @property
    def catalog(self) -> tuple[Recipe, ...]:
        """Every distinct check once, in catalog order (layers, embedding, LM head, optimizer)."""
        out: list[Recipe] = []
        if self.hidden:
            out.extend(Recipe(HIDDEN, p, i) for i, p in enumerate(self.layers))
        if self.embedding is not None:
            out.append(Recipe(EMBEDDING, self.embedding))
        if self.lm_head is not None:
            out.append(Recipe(LM_HEAD, self.lm_head))
        if self.optimizer:
            out.append(Recipe(OPTIMIZER, None))
        return tuple(out)

    @property
    def catalog_size(self) -> int:
        """``K``: the checks in one full rotation of the catalog."""
        return len(self.catalog)

    def _round(self, kind: str, step: int) -> int | None:
        """The 0-based round of ``kind`` due at ``step``, or None when it is not due."""
        interval = self.intervals[kind]
        if (step + 1) % interval != 0:
            return None
        return (step + 1) // interval - 1

    def any_due(self, step: int) -> bool:
        """Whether any recipe is due at ``step``: the healthy path's only per-step check."""
        n = step + 1
        return any(n % i == 0 for i in self._every)

    def due(self, step: int, *, optimizer_slices: int = 1) -> list[Recipe]:
        """The recipes due at the replay boundary of iteration ``step`` (0-based)."""
        out: list[Recipe] = []
        if self.hidden:
            r = self._round(HIDDEN, step)
            if r is not None:
                i = r % len(self.layers)
                out.append(Recipe(HIDDEN, self.layers[i], i))
        if self.embedding is not None and self._round(EMBEDDING, step) is not None:
            out.append(Recipe(EMBEDDING, self.embedding))
        if self.lm_head is not None and self._round(LM_HEAD, step) is not None:
            out.append(Recipe(LM_HEAD, self.lm_head))
        if self.optimizer:
            r = self._round(OPTIMIZER, step)
            if r is not None:
                out.append(Recipe(OPTIMIZER, None, r % max(1, optimizer_slices)))
        return out

    def modules_due(self, step: int) -> set[str]:
        """Module paths whose calls must be captured during iteration ``step``."""
        return {r.path for r in self.due(step) if r.path is not None}

    def overhead_estimate(self) -> float:
        """The paper's amortised layer-equivalent cost ``V/(I·N)`` of hidden-layer replay."""
        if not self.hidden:
            return 0.0
        return self.variants / (self.intervals[HIDDEN] * len(self.layers))
