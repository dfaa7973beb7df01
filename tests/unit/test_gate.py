"""The checkpoint gate's pure decision logic (Algorithm 3), without a process group."""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.decision.gate import (
    Action,
    Gate,
    LocalFlags,
    Outcome,
    Selection,
    retrieval,
)
from scout_core.decision.gate_wire import merge_flags
from scout_core.errors import ProtocolError
from scout_core.vocabulary import Failure


def boundary(gates: list[Gate], step: int, outcomes: list[Outcome], recipe: Any):
    """Run one boundary on several in-process gates the way the job does."""
    flags = [g.local_flags(step, o, recipe) for g, o in zip(gates, outcomes, strict=True)]
    job = merge_flags(flags)
    decisions = [g.decide(job, f) for g, f in zip(gates, flags, strict=True)]
    assert len(set(decisions)) == 1, "every rank must reach the same decision"
    for g, d in zip(gates, decisions, strict=True):
        g.apply(d)
    return decisions[0]


def test_two_recipe_scenario_promotes_step_2_and_sdc_retrieves_it() -> None:
    gates = [Gate(2) for _ in range(8)]
    clean = [Outcome.CLEAN] * 8
    d1 = boundary(gates, 1, clean, 0)
    assert d1.action is Action.CAPTURE and gates[0].q == 1
    d2 = boundary(gates, 2, clean, 1)
    assert d2.action is Action.ROTATE and d2.candidate == 2 and d2.promote is None
    assert (gates[0].candidate, gates[0].verified) == (2, None)
    assert boundary(gates, 3, clean, 0).action is Action.CAPTURE
    d4 = boundary(gates, 4, clean, 1)
    assert d4.action is Action.ROTATE and d4.promote == 2 and d4.candidate == 4
    assert (gates[0].latest, gates[0].candidate, gates[0].verified) == (4, 4, 2)
    sdc = [Outcome.CLEAN] * 8
    sdc[3] = Outcome.SDC  # only the attributed rank's group sees it; the job must follow
    d5 = boundary(gates, 5, sdc, 0)
    assert d5.action is Action.RETRIEVE and d5.failure is Failure.SDC
    found = gates[0].retrieve(d5.failure)
    assert (found.selected, found.step) == (Selection.VERIFIED, 2)


def test_a_cycle_needs_every_catalog_recipe_not_just_k_checks() -> None:
    gate = Gate(3)
    for step, recipe in [(1, 0), (2, 0), (3, 1)]:  # recipe 0 twice: still 2 distinct
        assert boundary([gate], step, [Outcome.CLEAN], recipe).action is Action.CAPTURE
    assert gate.q == 2
    assert boundary([gate], 4, [Outcome.CLEAN], 2).action is Action.ROTATE


def test_one_recipe_catalog_is_explicit_and_promotes_after_two_checks() -> None:
    gate = Gate(1)
    assert boundary([gate], 1, [Outcome.CLEAN], 0).action is Action.ROTATE
    assert (gate.candidate, gate.verified) == (1, None)
    d = boundary([gate], 2, [Outcome.CLEAN], 0)
    assert (d.promote, gate.verified, gate.candidate) == (1, 1, 2)
    with pytest.raises(ValueError, match="K"):
        Gate(0)


@pytest.mark.parametrize("bad", [Outcome.INCONCLUSIVE, Outcome.MISSING])
def test_not_clean_skips_capture_restarts_cycle_and_drops_candidate(bad: Outcome) -> None:
    gates = [Gate(2) for _ in range(3)]
    clean = [Outcome.CLEAN] * 3
    boundary(gates, 1, clean, 0)
    boundary(gates, 2, clean, 1)  # candidate 2
    boundary(gates, 3, clean, 0)
    outcomes = [Outcome.CLEAN, bad, Outcome.CLEAN]
    recipe = 1
    flags = [
        g.local_flags(4, o, None if o is Outcome.MISSING else recipe)
        for g, o in zip(gates, outcomes, strict=True)
    ]
    job = merge_flags(flags)
    d = gates[0].decide(job, flags[0])
    assert d.action is Action.SKIP and d.dropped == 2
    for g in gates:
        g.apply(d)
    assert (gates[0].latest, gates[0].candidate, gates[0].q) == (3, None, 0)
    # The next full clean cycle makes a new candidate but promotes nothing.
    boundary(gates, 5, clean, 0)
    d6 = boundary(gates, 6, clean, 1)
    assert d6.action is Action.ROTATE and d6.promote is None and gates[0].verified is None


def test_hang_at_a_boundary_retrieves() -> None:
    gates = [Gate(2), Gate(2), Gate(2)]
    d = boundary(gates, 1, [Outcome.CLEAN, Outcome.HANG, Outcome.CLEAN], 0)
    assert d.action is Action.RETRIEVE and d.failure is Failure.HANG


def test_disagreement_about_the_cycle_boundary_is_an_error() -> None:
    a, b = Gate(2), Gate(2)
    boundary([a], 1, [Outcome.CLEAN], 0)  # only a has accepted recipe 0
    fa, fb = a.local_flags(2, Outcome.CLEAN, 1), b.local_flags(2, Outcome.CLEAN, 1)
    assert fa.closes and not fb.closes
    with pytest.raises(ProtocolError, match="gate state"):
        merge_flags([fa, fb])
    # Same state digest but a disagreeing cycle flag still fails, on the flag itself.
    forged = LocalFlags(2, (1,), fa.state, False, False, False, False, False)
    with pytest.raises(ProtocolError, match="cycle boundary"):
        merge_flags([fa, forged])


def test_disagreement_about_step_or_recipe_is_an_error() -> None:
    a, b = Gate(2), Gate(2)
    with pytest.raises(ProtocolError, match="different steps"):
        merge_flags([a.local_flags(1, Outcome.CLEAN, 0), b.local_flags(2, Outcome.CLEAN, 0)])
    with pytest.raises(ProtocolError, match="different recipes"):
        merge_flags([a.local_flags(1, Outcome.CLEAN, 0), b.local_flags(1, Outcome.CLEAN, 1)])
    # A missing rank does not know the recipe; that is not a disagreement.
    job = merge_flags([a.local_flags(1, Outcome.CLEAN, 0), b.local_flags(1, Outcome.MISSING, None)])
    assert job.missing and job.recipes >= 0


def test_several_recipes_at_one_boundary_count_together() -> None:
    gate = Gate(4)  # e.g. one hidden layer, embedding, LM head, optimizer due together
    d = boundary([gate], 19, [Outcome.CLEAN], [0, 1, 2])
    assert d.action is Action.CAPTURE and gate.q == 3 and d.recipes == (0, 1, 2)
    assert boundary([gate], 39, [Outcome.CLEAN], [3, 1]).action is Action.ROTATE
    assert boundary([Gate(2)], 1, [Outcome.CLEAN], []).action is Action.SKIP  # no result


def test_worst_outcome_of_a_boundary() -> None:
    from scout_core.decision.gate import worst

    assert worst([Outcome.CLEAN, Outcome.CLEAN]) is Outcome.CLEAN
    assert worst([Outcome.CLEAN, Outcome.INCONCLUSIVE]) is Outcome.INCONCLUSIVE
    assert worst([Outcome.INCONCLUSIVE, Outcome.SDC, Outcome.HANG]) is Outcome.SDC
    assert worst([]) is Outcome.MISSING


def test_recipe_outside_the_catalog_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the catalog"):
        Gate(2).local_flags(1, Outcome.CLEAN, 2)


def test_retrieval_table() -> None:
    kw = {"latest": 9, "verified": 4}
    r = retrieval(Failure.SDC, **kw)
    assert (r.selected, r.step) == (Selection.VERIFIED, 4)
    r = retrieval(Failure.STRAGGLER, machines_accessible=False, **kw)
    assert (r.selected, r.step) == (Selection.VERIFIED, 4)
    for slow in (Failure.STRAGGLER, Failure.COMM_STRAGGLER):
        assert retrieval(slow, **kw).selected is Selection.LATEST
    ran: list[int] = []

    def sweep(result: Outcome):
        def run() -> Outcome:
            ran.append(1)
            return result

        return run

    r = retrieval(Failure.HANG, sweep=sweep(Outcome.CLEAN), **kw)
    assert (r.selected, r.step, r.sweep) == (Selection.LATEST, 9, Outcome.CLEAN)
    r = retrieval(Failure.HANG, sweep=sweep(Outcome.SDC), **kw)
    assert (r.selected, r.step) == (Selection.VERIFIED, 4)
    r = retrieval(Failure.PROTOCOL_MISMATCH, sweep=sweep(Outcome.INCONCLUSIVE), **kw)
    assert r.selected is Selection.VERIFIED  # an unfinished sweep never trusts latest
    assert len(ran) == 3
    r = retrieval(Failure.GROUP_STALL, **kw)  # no sweep available: fail closed
    assert r.selected is Selection.VERIFIED and "fail closed" in r.reason
    assert retrieval(Failure.SDC, latest=None, verified=None).step is None


def test_after_restore_of_verified_discards_newer_generations() -> None:
    gate = Gate(1)
    for step in (1, 2, 3):
        boundary([gate], step, [Outcome.CLEAN], 0)
    assert (gate.latest, gate.candidate, gate.verified) == (3, 3, 2)
    gate.after_restore(Selection.VERIFIED, 2)
    assert (gate.latest, gate.candidate, gate.verified, gate.q) == (2, None, 2, 0)


def test_resumed_after_a_restart_trusts_only_the_restored_generation() -> None:
    gate = Gate(2)
    gate.resumed(7)  # a fresh job restored verified step 7 from disk
    assert (gate.latest, gate.candidate, gate.verified, gate.q) == (7, None, 7, 0)
    boundary([gate], 8, [Outcome.CLEAN], 0)
    boundary([gate], 9, [Outcome.CLEAN], 1)  # cycle closes: 9 is the candidate
    assert (gate.latest, gate.candidate, gate.verified) == (9, 9, 7)
    assert retrieval(Failure.SDC, latest=gate.latest, verified=gate.verified).step == 7
