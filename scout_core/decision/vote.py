"""One job-wide reduction per replay boundary for every part that must agree there.

Contract: each part takes a :class:`Seat` from :class:`BoundaryVote`; the first read of an
event's result reduces every seat's words in one ``MAX`` reduction, later reads reuse it. All
ranks read at the same (due) boundaries; ranks that disagree whether a part runs raise
:class:`~scout_core.errors.ProtocolError`. Presence words: docs/internals.md, "The boundary vote".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import torch.distributed as dist

from scout_core.decision.agreement import check_group, reduce_max
from scout_core.errors import ProtocolError

__all__ = ["NEUTRAL", "BoundaryVote", "Seat"]

E = TypeVar("E")

NEUTRAL = -(1 << 62)
"""The word an absent seat sends (below any word a present rank sends)."""


class Seat(Generic[E]):
    """One part's place in a :class:`BoundaryVote`."""

    def __init__(
        self,
        vote: BoundaryVote[E],
        name: str,
        width: int,
        words: Callable[[E], Sequence[int] | None],
    ) -> None:
        self.vote = vote
        self.name = name
        self.width = width
        self.words = words

    def ballot(self, event: E) -> list[int]:
        """This rank's slice for ``event``: presence words, then the part's words."""
        mine = self.words(event)
        if mine is None:
            return [0, 1] + [NEUTRAL] * self.width
        if len(mine) != self.width:
            raise ValueError(f"seat {self.name!r} sent {len(mine)} words, expected {self.width}")
        return [1, 0, *(int(w) for w in mine)]

    def result(self, event: E) -> list[int] | None:
        """The job-wide ``MAX`` of the words for ``event``; ``None`` when no rank was present."""
        present, absent, *words = self.vote.slice(self, event)
        if present and absent:
            raise ProtocolError(
                f"ranks disagree whether the {self.name} decides at this boundary; "
                "every rank must run the same schedule"
            )
        return words if present else None


class BoundaryVote(Generic[E]):
    """The seats of one job and the last event's reduced words (module doc)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = check_group(group)  # a SCOUT group over the whole job
        self.seats: list[Seat[E]] = []
        self._event: E | None = None
        self._maxima: list[int] = []
        self.casts = 0

    def seat(self, name: str, width: int, words: Callable[[E], Sequence[int] | None]) -> Seat[E]:
        """A new seat of ``width`` words. Every rank adds the same seats in the same order."""
        if width < 0:
            raise ValueError(f"a seat has >= 0 words, got {width}")
        seat = Seat(self, name, width, words)
        self.seats.append(seat)
        return seat

    def slice(self, seat: Seat[E], event: E) -> list[int]:
        """``seat``'s reduced slice for ``event``, casting the vote on its first read."""
        if self._event is not event:
            ballots = [w for s in self.seats for w in s.ballot(event)]
            self._maxima = reduce_max(ballots, self.group)
            self._event = event
            self.casts += 1
        offset = 0
        for s in self.seats:
            if s is seat:
                return self._maxima[offset : offset + 2 + s.width]
            offset += 2 + s.width
        raise ValueError(f"seat {seat.name!r} is not part of this vote")
