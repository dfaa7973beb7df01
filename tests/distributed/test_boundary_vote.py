"""The boundary vote: every seat's words in one collective (a gather while small), presence
checked (3 ranks)."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from scout_core.testing.harness import run_ranks


def vote_rank() -> dict[str, Any]:
    from scout_core.decision.vote import BoundaryVote
    from scout_core.errors import ProtocolError
    from scout_core.topology.groups import diagnostic_group

    rank = dist.get_rank()
    calls: list[str] = []
    # Count every collective the vote could use (test-only counters, restored below).
    names = [
        n for n in ("all_reduce", "all_gather_single", "all_gather_into_tensor") if hasattr(dist, n)
    ]
    real = {n: getattr(dist, n) for n in names}

    def counter(name: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real[name](*args, **kwargs)

        return counted

    for n in names:
        setattr(dist, n, counter(n))
    try:
        vote: BoundaryVote[str] = BoundaryVote(diagnostic_group())
        flags = vote.seat("flags", 2, lambda e: [rank, -rank])
        quiet = vote.seat("quiet", 1, lambda e: None)
        mixed = vote.seat("mixed", 1, lambda e: [7] if e == "mixed" and rank == 0 else None)
        first = "a"
        # Read in a different order on each rank: the cast happens once, whoever reads.
        if rank % 2:
            got_quiet = quiet.result(first)
            got_flags = flags.result(first)
        else:
            got_flags = flags.result(first)
            got_quiet = quiet.result(first)
        again = flags.result(first)
        casts_after_a = vote.casts
        raised = ""
        event = "mixed"
        try:
            mixed.result(event)
        except ProtocolError as exc:
            raised = str(exc)
        other = flags.result(event)  # same event: no second collective
        return {
            "flags": got_flags,
            "quiet": got_quiet,
            "again": again,
            "casts_after_a": casts_after_a,
            "casts": vote.casts,
            "calls": calls,
            "raised": raised,
            "other": other,
        }
    finally:
        for n, fn in real.items():
            setattr(dist, n, fn)


@pytest.mark.timeout(200)
def test_one_collective_per_event_and_presence_checked() -> None:
    results = run_ranks(vote_rank, 3, timeout_s=150)
    for res in results:
        assert res["flags"] == [2, 0]  # MAX of rank and of -rank (the minimum, negated)
        assert res["again"] == [2, 0]
        assert res["quiet"] is None  # absent on every rank
        assert res["casts_after_a"] == 1
        # Three seats of 4 words on 3 ranks: small, so each event is one gather, no all-reduce.
        gather = (
            "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
        )
        assert res["casts"] == 2 and res["calls"] == [gather, gather]
        assert "ranks disagree whether the mixed decides" in res["raised"]
        assert res["other"] == [2, 0]
