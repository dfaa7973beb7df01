"""The checkpoint gate (paper §8, Algorithm 3): which checkpoint recovery may trust.

Contract: the gate is pure. :meth:`Gate.decide` maps job-wide flags to a :class:`Decision`,
:meth:`Gate.apply` commits it, :func:`retrieval` picks what recovery may restore. Terms and
agreement: docs/checkpoint_gate.md, "Generations and cycles" and "Job-wide agreement".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from scout_core.decision.agreement import digest as _digest
from scout_core.vocabulary import Failure

__all__ = [
    "Outcome",
    "Action",
    "Selection",
    "LocalFlags",
    "JobFlags",
    "Decision",
    "Retrieval",
    "Gate",
    "retrieval",
    "worst",
    "SLOWNESS",
]


class Outcome(str, Enum):
    """What one replay boundary showed on one rank (all of its peer groups together)."""

    CLEAN = "clean"
    """Every comparison agreed (a completed straggler verdict is still clean)."""
    SDC = "sdc"
    """A numerical comparison attributed an outlier."""
    INCONCLUSIVE = "inconclusive"
    """A numerical comparison had no strict majority: not clean."""
    MISSING = "missing"
    """This rank has no result for the boundary."""
    HANG = "hang"


class Action(str, Enum):
    """What the gate does at one replay boundary."""

    CAPTURE = "capture"
    """Accepted check inside a cycle: capture ``latest``."""
    ROTATE = "rotate"
    """Closes the cycle: capture ``latest``, candidate → verified, ``latest`` → saved candidate."""
    SKIP = "skip"
    """Not clean (inconclusive/missing): capture nothing, restart the cycle, drop the candidate."""
    RETRIEVE = "retrieve"
    """SDC or hang somewhere in the job: select a checkpoint for recovery."""


class Selection(str, Enum):
    """Which generation a retrieval selects (the evidence field ``selected``)."""

    LATEST = "latest"
    VERIFIED = "verified"


SLOWNESS: frozenset[Failure] = frozenset({Failure.STRAGGLER, Failure.COMM_STRAGGLER})
"""Failures that are slowness alone; retrieval trusts ``latest`` after them."""


@dataclass(frozen=True, slots=True)
class LocalFlags:
    """One rank's view of a boundary, before the job-wide combine."""

    step: int
    recipes: tuple[int, ...]
    """Catalog indices of the recipes checked at this boundary (empty when missing)."""
    state: int
    """62-bit digest of the gate state (counter, accepted set, generations)."""
    missing: bool
    sdc: bool
    hang: bool
    unclean: bool
    closes: bool
    """Accepting these recipes would close the cycle (meaningful when present)."""


@dataclass(frozen=True, slots=True)
class JobFlags:
    """The job-wide combination of every rank's :class:`LocalFlags` (identical everywhere)."""

    step: int
    recipes: int
    """Digest of the recipes the present ranks checked (``-1``: every rank missing)."""
    missing: bool
    sdc: bool
    hang: bool
    unclean: bool
    closes: bool


_SEVERITY = (Outcome.CLEAN, Outcome.INCONCLUSIVE, Outcome.MISSING, Outcome.HANG, Outcome.SDC)


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    """A rank's outcome: SDC > hang > missing > inconclusive > clean; no rounds fails closed."""
    found = [Outcome(o) for o in outcomes]
    if not found:
        return Outcome.MISSING
    return max(found, key=_SEVERITY.index)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gate decided at one boundary (pure data; :meth:`Gate.apply` commits it)."""

    action: Action
    step: int
    recipes: tuple[int, ...] = ()
    """CAPTURE / ROTATE: the catalog recipes accepted at this boundary."""
    promote: int | None = None
    """ROTATE: the candidate step that becomes verified (``None`` in the first cycle)."""
    candidate: int | None = None
    """ROTATE: the step that becomes the new candidate (this boundary)."""
    dropped: int | None = None
    """SKIP: the candidate that lost its chance of promotion."""
    failure: Failure | None = None
    """RETRIEVE: SDC or hang."""
    reason: str = ""

    @property
    def captures(self) -> bool:
        """Whether this boundary captures an in-memory checkpoint."""
        return self.action in (Action.CAPTURE, Action.ROTATE)


@dataclass(frozen=True, slots=True)
class Retrieval:
    """Which checkpoint recovery should use, and why."""

    selected: Selection
    step: int | None
    """Step of the selected generation, ``None`` when the gate holds none."""
    reason: str
    sweep: Outcome | None = None
    """The full-catalog sweep's job-wide outcome, when one ran."""
    failure: Failure | None = None
    """The failure a replay boundary (at step ``found_at``) found, when selected there."""
    found_at: int | None = None


class Gate:
    """Algorithm 3's state machine for one job; every rank holds an identical copy."""

    def __init__(self, catalog_size: int) -> None:
        if isinstance(catalog_size, bool) or not isinstance(catalog_size, int) or catalog_size < 1:
            raise ValueError(f"catalog_size (K) must be an int >= 1, got {catalog_size!r}")
        self.catalog_size = catalog_size
        self.latest: int | None = None
        self.candidate: int | None = None
        self.verified: int | None = None
        self.cycles = 0
        self._accepted: set[int] = set()

    @property
    def q(self) -> int:
        """Accepted recipes in the current cycle (Algorithm 3's counter)."""
        return len(self._accepted)

    @property
    def accepted(self) -> frozenset[int]:
        """Catalog indices accepted in the current cycle."""
        return frozenset(self._accepted)

    def digest(self) -> int:
        """62-bit digest of the whole state; equal on ranks whose gates agree."""
        return _digest(
            (
                self.catalog_size,
                sorted(self._accepted),
                self.cycles,
                self.latest,
                self.candidate,
                self.verified,
            )
        )

    def local_flags(
        self, step: int, outcome: Outcome, recipes: int | Iterable[int] | None
    ) -> LocalFlags:
        """This rank's flags at ``step``; ``recipes`` are the catalog indices checked here
        (one int, several, or ``None`` / empty when this rank has no result)."""
        outcome = Outcome(outcome)
        if recipes is None:
            checked: tuple[int, ...] = ()
        elif isinstance(recipes, int):
            checked = (recipes,)
        else:
            checked = tuple(sorted(set(recipes)))
        bad = [r for r in checked if not 0 <= r < self.catalog_size]
        if bad:
            raise ValueError(
                f"recipe indices {bad} are outside the catalog of K={self.catalog_size}"
            )
        missing = outcome is Outcome.MISSING or not checked
        closes = not missing and len(self._accepted | set(checked)) == self.catalog_size
        return LocalFlags(
            step=int(step),
            recipes=() if missing else checked,
            state=self.digest(),
            missing=missing,
            sdc=outcome is Outcome.SDC,
            hang=outcome is Outcome.HANG,
            unclean=outcome is Outcome.INCONCLUSIVE,
            closes=closes,
        )

    def decide(self, job: JobFlags, local: LocalFlags) -> Decision:
        """Algorithm 3's ``CheckpointSave``, pure; ``local`` only supplies the recipe indices
        (:func:`combine` checked they match on every rank with a result)."""
        if job.sdc or job.hang:
            failure = Failure.SDC if job.sdc else Failure.HANG
            return Decision(
                Action.RETRIEVE,
                job.step,
                failure=failure,
                reason=f"job-wide outcome is {failure.value}",
            )
        if job.missing or job.unclean:
            why = "a rank has no result" if job.missing else "a check was inconclusive"
            return Decision(
                Action.SKIP,
                job.step,
                dropped=self.candidate,
                reason=f"not clean: {why}; capture skipped, cycle restarts",
            )
        if job.closes:
            return Decision(
                Action.ROTATE,
                job.step,
                local.recipes,
                promote=self.candidate,
                candidate=job.step,
                reason=f"cycle {self.cycles + 1} of K={self.catalog_size} recipes closed clean",
            )
        accepted = len(self._accepted | set(local.recipes))
        return Decision(
            Action.CAPTURE,
            job.step,
            local.recipes,
            reason=f"accepted {accepted} of K={self.catalog_size} recipes in this cycle",
        )

    def apply(self, decision: Decision, *, captured: bool = True) -> None:
        """Commit ``decision`` (from :meth:`decide` on this gate). ``captured=False``: a CAPTURE
        not taken (lean ``Config.gate_memory``): recipes count, ``latest`` stays the last held."""
        if decision.action is Action.CAPTURE:
            if captured:
                self.latest = decision.step
            self._accepted.update(decision.recipes)
        elif decision.action is Action.ROTATE:
            self.latest = decision.step
            if self.candidate is not None:
                self.verified = self.candidate
            self.candidate = decision.step
            self._accepted.clear()
            self.cycles += 1
        elif decision.action is Action.SKIP:
            self._accepted.clear()
            self.candidate = None
        # RETRIEVE changes nothing until a generation is restored (after_restore).

    def after_restore(self, selection: Selection, step: int) -> None:
        """Training resumes from generation ``step``. Restoring ``verified`` discards everything
        newer (the candidate may hold the corruption) and restarts the cycle."""
        if Selection(selection) is Selection.VERIFIED:
            self.latest = step
            self.candidate = None
            self._accepted.clear()
        else:
            self.latest = step

    def resumed(self, step: int) -> None:
        """A restarted job restored verified ``step`` from disk: verified and latest, new cycle."""
        self.latest = self.verified = step
        self.candidate = None
        self._accepted.clear()

    def retrieve(
        self,
        failure: Failure | None,
        *,
        machines_accessible: bool = True,
        sweep: Callable[[], Outcome] | None = None,
    ) -> Retrieval:
        """:func:`retrieval` on this gate's ``latest`` and ``verified``."""
        return retrieval(
            failure,
            latest=self.latest,
            verified=self.verified,
            machines_accessible=machines_accessible,
            sweep=sweep,
        )


def retrieval(
    failure: Failure | None,
    *,
    latest: int | None,
    verified: int | None,
    machines_accessible: bool = True,
    sweep: Callable[[], Outcome] | None = None,
) -> Retrieval:
    """Algorithm 3's ``CheckpointRetrieval``: ``latest`` or ``verified`` by the table in
    docs/checkpoint_gate.md, "Retrieval"; ``sweep`` returns the *job-wide* outcome."""
    failure = None if failure is None else Failure(failure)
    if failure is Failure.SDC:
        return Retrieval(Selection.VERIFIED, verified, "sdc: only certified state is trusted")
    if not machines_accessible:
        return Retrieval(
            Selection.VERIFIED,
            verified,
            "a machine is unreachable: its latest shard cannot be checked",
        )
    if failure in SLOWNESS:
        assert failure is not None  # narrowed for the message
        return Retrieval(
            Selection.LATEST, latest, f"{failure.value}: slowness alone is not corruption"
        )
    what = "no failure class" if failure is None else failure.value
    if sweep is None:
        return Retrieval(
            Selection.VERIFIED, verified, f"{what}: no full-catalog sweep available (fail closed)"
        )
    result = Outcome(sweep())
    if result is Outcome.CLEAN:
        return Retrieval(
            Selection.LATEST, latest, f"{what}: full-catalog sweep was clean", sweep=result
        )
    return Retrieval(
        Selection.VERIFIED,
        verified,
        f"{what}: full-catalog sweep was {result.value}, latest not trusted",
        sweep=result,
    )
