"""What a test asks of replay's schedule: did every round that was due run?

``session.on_boundary(log)`` with a :class:`RoundLog` counts the boundaries, the recipes
the schedule made due and the rounds that ran, and lists each due recipe that ran no
round. A test then asserts the property (:func:`ran_every_due_round`) instead of a count
derived by hand from today's schedule, which a change of cadence would make wrong
without anything being broken.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["RoundLog", "ran_every_due_round"]


class RoundLog:
    """A boundary subscriber (module doc)."""

    def __init__(self) -> None:
        self.boundaries = 0
        self.due = 0
        self.rounds: list[Any] = []
        """Every :class:`~scout_core.replay.runner.RoundOutcome`, in order."""
        self.missing: list[list[Any]] = []
        """``[step, recipe kind, recipe name]`` of each due recipe that ran no round."""

    def __call__(self, boundary: Any) -> None:
        self.boundaries += 1
        self.due += len(boundary.due)
        self.rounds.extend(boundary.rounds)
        ran = [r.recipe for r in boundary.rounds]
        for recipe in boundary.due:
            if recipe in ran:
                ran.remove(recipe)
            else:
                self.missing.append([int(boundary.step), str(recipe.kind), recipe.name])

    def summary(self) -> dict[str, Any]:
        """JSON: ``boundaries``, ``due``, ``rounds``, ``ready`` (rounds that passed
        readiness) and ``missing`` (:attr:`missing`)."""
        return {
            "boundaries": self.boundaries,
            "due": self.due,
            "rounds": len(self.rounds),
            "ready": sum(bool(r.ready) for r in self.rounds),
            "missing": [list(m) for m in self.missing],
        }


def ran_every_due_round(
    summary: dict[str, Any], steps: int, *, skipped: Iterable[str] = ()
) -> bool:
    """Whether a :meth:`RoundLog.summary` shows ``steps`` boundaries with something due at
    each (a replay interval of 1), and a round for every due recipe but those of the
    ``skipped`` kinds (a recipe SCOUT documents it skips in this setup)."""
    allowed = set(skipped)
    return bool(
        summary["boundaries"] == steps
        and summary["due"] >= steps
        and all(kind in allowed for _, kind, _ in summary["missing"])
        and summary["rounds"] == summary["due"] - len(summary["missing"])
    )
