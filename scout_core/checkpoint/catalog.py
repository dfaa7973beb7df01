"""What a replay boundary means for the checkpoint gate: catalog slots and one outcome.

Contract: both gates read the due recipes of a boundary as catalog slots (by ``(kind,
path)``) and this rank's outcome, the worst of :func:`round_outcome` over them (a due recipe
without a round is missing; a custody verdict naming this rank is SDC). :func:`agreed_catalog`
folds replay's catalog, minus recipes the job can never run, onto ``Config.catalog_size``
slots. Docs: docs/checkpoint_gate.md, "What the wiring does".
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from scout_core.config import Config
from scout_core.decision.agreement import same_value
from scout_core.decision.gate import Gate, JobFlags, LocalFlags, Outcome, worst
from scout_core.decision.gate_wire import WIDTH, combine, fold_words, words
from scout_core.decision.vote import BoundaryVote
from scout_core.errors import ConfigError
from scout_core.replay.boundary import Boundary
from scout_core.replay.driver import ReplayDriver
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import OPTIMIZER, Recipe
from scout_core.vocabulary import Mode, Status

__all__ = ["GateCatalog", "GateAgreement", "agreed_catalog", "round_outcome"]

log = logging.getLogger(__name__)


def round_outcome(round_: RoundOutcome) -> Outcome:
    """The gate outcome of one recipe round on this rank (see the module doc)."""
    if not round_.ready:
        return Outcome.INCONCLUSIVE
    exact = [r for r in round_.results.values() if r.mode is Mode.EXACT]
    if any(r.status is Status.ATTRIBUTED for r in exact):
        return Outcome.SDC
    if any(r.status is Status.INCONCLUSIVE for r in exact):
        return Outcome.INCONCLUSIVE
    return Outcome.CLEAN


def _key(recipe: Recipe) -> tuple[str, str | None]:
    return (recipe.kind, recipe.path)


@dataclass(frozen=True)
class GateCatalog:
    """The recipes a gate certifies with, folded onto ``size`` slots."""

    recipes: tuple[Recipe, ...]
    size: int

    @functools.cached_property
    def slots(self) -> dict[tuple[str, str | None], int]:
        """Catalog slot of each recipe, by ``(kind, path)``."""
        return {_key(r): i % self.size for i, r in enumerate(self.recipes)}

    def evaluate(self, boundary: Boundary) -> tuple[Outcome, list[int]] | None:
        """This rank's outcome and the catalog slots checked at ``boundary``; None if none due."""
        if not boundary.due:
            return None
        slots = self.slots
        due = [r for r in boundary.due if _key(r) in slots]
        if not due:
            return None
        outcomes = [
            worst(round_outcome(o) for o in boundary.rounds if _key(o.recipe) == _key(r))
            for r in due  # no round → MISSING
        ]
        if boundary.custody:  # this rank's parameters changed with no writer: localized
            outcomes.append(Outcome.SDC)
        return worst(outcomes), [slots[_key(r)] for r in due]


class GateAgreement:
    """How both gates agree job-wide at a boundary: the flag words ride the boundary's one
    reduction (a :class:`~scout_core.decision.vote.BoundaryVote` seat), or without a vote
    combine alone on ``group``. ``gate`` returns the state machine; ``holding`` says a
    selection is pending (then the gate decides nothing, on every rank)."""

    def __init__(
        self,
        vote: BoundaryVote[Boundary] | None,
        catalog: GateCatalog,
        gate: Callable[[], Gate],
        holding: Callable[[], bool],
        group: dist.ProcessGroup,
    ) -> None:
        self.catalog = catalog
        self.group = group
        self._gate = gate
        self._holding = holding
        self._seat = None if vote is None else vote.seat("checkpoint gate", WIDTH, self.words)

    def words(self, boundary: Boundary) -> list[int] | None:
        """This rank's flags for ``boundary``; None when the gate decides nothing there."""
        found = self.catalog.evaluate(boundary)
        if found is None or self._holding():
            return None
        return words(self._gate().local_flags(boundary.step, *found))

    def job(self, boundary: Boundary) -> JobFlags | None:
        """The voted job-wide flags of ``boundary``, or None without a vote or where the gate
        decides nothing. Read at every due boundary, so the vote is cast even when idle."""
        if self._seat is None or not boundary.due:
            return None
        maxima = self._seat.result(boundary)
        return None if maxima is None else fold_words(maxima)

    def agree(self, boundary: Boundary) -> tuple[JobFlags, LocalFlags] | None:
        """Job-wide and this rank's flags of ``boundary``, or None as :meth:`words`; collective."""
        voted = self.job(boundary)
        found = self.catalog.evaluate(boundary)
        if found is None or self._holding():
            return None
        local = self._gate().local_flags(boundary.step, *found)
        return (combine(local, group=self.group) if voted is None else voted), local


def agreed_catalog(
    driver: ReplayDriver, config: Config, group: dist.ProcessGroup
) -> GateCatalog | None:
    """The gate catalog of this job (see the module doc), or None when there is nothing
    to certify with or the ranks' catalogs differ in shape. Collective over ``group``
    (the whole job). Raises :class:`ConfigError` for a ``K`` no cycle could reach."""
    recipes = driver.schedule.catalog
    if not driver.opt.supported:
        recipes = tuple(r for r in recipes if r.kind != OPTIMIZER)
    size = config.catalog_size if config.catalog_size is not None else len(recipes)
    if recipes and size > len(recipes):
        raise ConfigError(
            f"catalog_size K={size} exceeds the {len(recipes)} checks this job's replay can "
            "run; no recipe cycle could ever close"
        )
    shape = (size, [r.kind for r in recipes], sorted(driver.schedule.intervals.items()))
    if not same_value(shape, group):
        log.warning(
            "the ranks' recipe catalogs differ in shape (this rank: %s); the "
            "checkpoint gate is off (replay still runs)",
            shape,
        )
        return None
    if not recipes:
        return None
    return GateCatalog(recipes, size)
