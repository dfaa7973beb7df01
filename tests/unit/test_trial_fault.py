"""``TrialFault``, one campaign trial's fault, in one process (no process group): each
kind strikes the victim only, at its step, and says when it struck."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from scout_core.testing import FAULT_KINDS, TinyLM, TrialFault, train_step


def spec(kind: str, **over: Any) -> dict[str, Any]:
    return {"kind": kind, "rank": 1, "step": 2, "stall_s": 0.3, "delay_s": 0.2} | over


def run(kind: str, rank: int, steps: int = 4, **over: Any) -> tuple[TrialFault, TinyLM]:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fault = TrialFault(spec(kind, **over), rank=rank)
    fault.prepare()
    fault.attach(model, opt, layers=[f"layers.{i}" for i in range(4)], param="layers.0.fc1.weight")
    for step in fault.batches(None, steps):
        fault.before_step(step)
        train_step(model, opt, step, 0)
        fault.after_step(step, None)
    fault.detach()
    return fault, model


def test_every_kind_is_known_and_an_unknown_one_is_refused() -> None:
    assert "clean" in FAULT_KINDS and len(FAULT_KINDS) == 11
    with pytest.raises(ValueError, match="unknown fault kind"):
        TrialFault(spec("cosmic_ray"), rank=0)


@pytest.mark.parametrize("kind", ["param_sdc", "compute_sdc", "optimizer_sdc"])
def test_a_numerical_fault_changes_the_victim_only(kind: str) -> None:
    clean = run("clean", rank=1)[1].state_dict()
    bystander = run(kind, rank=0)[1].state_dict()
    fault, victim = run(kind, rank=1)
    assert all(torch.equal(clean[k], v) for k, v in bystander.items())
    assert any(not torch.equal(clean[k], v) for k, v in victim.state_dict().items())
    result = fault.result()
    assert result["victim"] is True and result["injected_at"] is not None
    assert result["fired"] and all(step >= 2 for *_, step in result["fired"])


def test_optimizer_state_is_only_there_after_the_first_step() -> None:
    fault, _ = run("optimizer_sdc", rank=1, step=0, steps=2)
    assert fault.result()["injected_at"] is None  # nothing to corrupt at step 0: no fault


@pytest.mark.parametrize("kind", ["input_stall", "hang_gil"])
def test_a_stall_holds_the_victims_injection_step(kind: str) -> None:
    """The victim's fetch (input stall) or step start (a GIL-holding thread) of step 2
    takes at least ``stall_s``; a bystander is not stalled at all (it strikes nothing)."""
    for rank in (0, 1):
        fault = TrialFault(spec(kind), rank=rank)
        took: dict[int, float] = {}
        batches = iter(fault.batches(None, 4))
        while True:
            start = time.monotonic()
            step = next(batches, None)
            if step is None:
                break
            fault.before_step(step)
            took[step] = time.monotonic() - start
        assert (fault.result()["injected_at"] is not None) == (rank == 1)
        if rank == 1:
            assert took[2] >= 0.3, took


def test_a_straggler_is_slow_for_its_window_on_the_victim() -> None:
    fault, _ = run("compute_straggler", rank=1, steps=8, window=3)
    steps = sorted({step for kind, _, step in fault.result()["fired"]})
    assert steps == [2, 3, 4]
    assert not run("compute_straggler", rank=0)[0].result()["fired"]


def test_a_clean_control_never_strikes() -> None:
    fault, _ = run("clean", rank=1)
    assert fault.mine is False
    assert fault.result() | {"rank": 0} == {
        "rank": 0,
        "kind": "clean",
        "victim": False,
        "injected_at": None,
        "fired": [],
    }
