"""The step clock: one boundary per training iteration, whatever the optimizers do."""

from __future__ import annotations

import pytest
import torch

from scout_core.replay.boundary import Boundary, BoundaryEvents, StepClock


def _opt() -> torch.optim.Optimizer:
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    return torch.optim.SGD([p], lr=0.1)


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def pre(self, which: int) -> None:
        self.events.append(f"pre{which}")

    def boundary(self) -> None:
        self.events.append("B")


def test_several_optimizers_give_one_boundary_after_all_stepped() -> None:
    a, b = _opt(), _opt()
    log = _Log()
    clock = StepClock([a, b], [1, 1], pre=log.pre, boundary=log.boundary)
    for _ in range(2):
        a.step()
        b.step()
    assert log.events == ["pre0", "pre1", "B", "pre0", "pre1", "B"]
    clock.close()
    a.step()
    assert log.events[-1] == "B" and len(log.events) == 6  # hooks removed


def test_an_optimizer_stepped_per_group_fires_at_its_first_step() -> None:
    """ZeRO steps its inner optimizer once per parameter group: the boundary is the first."""
    inner = _opt()
    log = _Log()
    StepClock([inner], [3], pre=log.pre, boundary=log.boundary)
    for _ in range(6):
        inner.step()
    assert log.events == ["pre0", "B", "pre0", "B"]


def test_a_failing_boundary_does_not_derail_the_next_iteration() -> None:
    opt = _opt()
    calls = []

    def boundary() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("subscriber failed")

    StepClock([opt], [1], pre=lambda i: None, boundary=boundary)
    with pytest.raises(RuntimeError):
        opt.step()
    opt.step()
    assert len(calls) == 2


def test_reset_forgets_a_partly_stepped_iteration() -> None:
    a, b = _opt(), _opt()
    log = _Log()
    clock = StepClock([a, b], [1, 1], pre=log.pre, boundary=log.boundary)
    a.step()
    clock.reset()
    a.step()
    b.step()
    assert log.events == ["pre0", "pre0", "pre1", "B"]


def test_counts_must_match_the_optimizers() -> None:
    with pytest.raises(ValueError, match="one count per optimizer"):
        StepClock([_opt()], [1, 1], pre=lambda i: None, boundary=lambda: None)
    with pytest.raises(ValueError, match=">= 1"):
        StepClock([_opt()], [0], pre=lambda i: None, boundary=lambda: None)


def test_events_reach_subscribers_until_removed() -> None:
    events = BoundaryEvents()
    seen: list[int] = []
    remove = events.subscribe(lambda b: seen.append(b.step))
    events.publish(Boundary(0, (), ()))
    remove()
    remove()  # twice is harmless
    events.publish(Boundary(1, (), ()))
    assert seen == [0]
