"""RoundLog and ran_every_due_round: the property replay tests assert instead of counts."""

from __future__ import annotations

from types import SimpleNamespace

from scout_core.replay.schedule import Recipe
from scout_core.testing import RoundLog, ran_every_due_round

HIDDEN = Recipe("hidden", "layers.0")
OPT = Recipe("optimizer", None)


def _boundary(step: int, due: list[Recipe], ran: list[Recipe]) -> SimpleNamespace:
    rounds = [SimpleNamespace(recipe=r, ready=True) for r in ran]
    return SimpleNamespace(step=step, due=tuple(due), rounds=tuple(rounds))


def _log(*boundaries: SimpleNamespace) -> dict[str, object]:
    log = RoundLog()
    for b in boundaries:
        log(b)
    return log.summary()


def test_every_due_round_ran() -> None:
    s = _log(_boundary(0, [HIDDEN, OPT], [HIDDEN, OPT]), _boundary(1, [HIDDEN], [HIDDEN]))
    assert s == {"boundaries": 2, "due": 3, "rounds": 3, "ready": 3, "missing": []}
    assert ran_every_due_round(s, 2)


def test_a_due_round_that_did_not_run_fails_unless_its_kind_is_a_documented_skip() -> None:
    s = _log(_boundary(0, [HIDDEN, OPT], [HIDDEN]), _boundary(1, [HIDDEN], [HIDDEN]))
    assert s["missing"] == [[0, "optimizer", OPT.name]]
    assert not ran_every_due_round(s, 2)
    assert ran_every_due_round(s, 2, skipped=["optimizer"])
    assert not ran_every_due_round(s, 2, skipped=["hidden"])


def test_a_missing_boundary_or_an_empty_schedule_fails() -> None:
    one = _log(_boundary(0, [HIDDEN], [HIDDEN]))
    assert not ran_every_due_round(one, 2)  # a boundary is missing
    idle = _log(_boundary(0, [], []), _boundary(1, [], []))
    assert not ran_every_due_round(idle, 2)  # nothing was due: nothing was checked
