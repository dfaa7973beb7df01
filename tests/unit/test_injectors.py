"""The fault injectors: exact corruption, (rank, step) keying, chaining, taps."""

from __future__ import annotations

import time

import pytest
import torch

from scout_core.decision.signature import signature
from scout_core.replay import taps
from scout_core.testing.injectors import AddNoise, BitFlip, Faults, Scale, flip_bit
from scout_core.testing.models import TinyLM, batch, train_step


def test_low_mantissa_flip_is_tiny_but_changes_the_signature() -> None:
    x = torch.full((4,), 1.0)
    before = signature(x)
    flip_bit(x, index=2, bit=0)
    assert x[2].item() != 1.0
    assert abs(x[2].item() - 1.0) < 1e-6
    assert x[0].item() == x[1].item() == x[3].item() == 1.0
    assert signature(x) != before
    flip_bit(x, index=2, bit=0)
    assert signature(x) == before  # a flip is its own inverse


def test_sign_bit_and_bounds() -> None:
    x = torch.tensor([2.0], dtype=torch.float64)
    flip_bit(x, bit=63)
    assert x.item() == -2.0
    with pytest.raises(ValueError):
        flip_bit(x, bit=64)


def test_scale_and_noise_are_deterministic() -> None:
    a, b = torch.ones(5), torch.ones(5)
    AddNoise(std=0.1, seed=3).apply_(a)
    AddNoise(std=0.1, seed=3).apply_(b)
    assert torch.equal(a, b) and not torch.equal(a, torch.ones(5))
    Scale(2.0).apply_(b)
    assert torch.equal(b, a * 2)


def test_at_needs_exactly_one_when() -> None:
    with pytest.raises(ValueError):
        Faults().at(rank=0)
    with pytest.raises(ValueError):
        Faults().at(rank=0, step=1, persistent=True)


def _train(faults: Faults, steps: int, rank: int = 0) -> tuple[TinyLM, list[float]]:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    faults.attach(model, opt, rank=rank)
    losses = [train_step(model, opt, s, 0) for s in range(steps)]
    faults.detach()
    return model, losses


def test_faults_fire_only_at_their_rank_and_step() -> None:
    faults = (
        Faults()
        .at(rank=0, step=2)
        .corrupt_param("layers.1.fc1.weight", Scale(0.0))
        .at(rank=1, step=1)
        .corrupt_output("layers.0", Scale(5.0))
        .at(rank=0, steps=range(1, 3))
        .corrupt_output("layers.3", BitFlip(bit=0))
    )
    _, losses = _train(faults, 4, rank=0)
    assert faults.fired() == [
        ("output", "layers.3", 1),
        ("output", "layers.3", 2),
        ("param", "layers.1.fc1.weight", 2),
    ]
    _, clean = _train(Faults(), 4, rank=0)
    assert losses[0] == clean[0]  # nothing happened at step 0
    assert losses[3] != clean[3]  # the zeroed parameter changed training from step 3


def test_grad_and_optimizer_state_corruption() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    faults = (
        Faults()
        .at(rank=0, step=1)
        .corrupt_grad("head.weight", Scale(0.0))
        .at(rank=0, step=2)
        .corrupt_optimizer_state("head.weight", Scale(0.0), key="exp_avg")
    )
    faults.attach(model, opt, rank=0)
    for s in range(3):
        train_step(model, opt, s, 0)
    assert [f[0] for f in faults.fired()] == ["grad", "optim"]


def test_compute_delay_and_taps() -> None:
    faults = Faults().at(rank=0, step=0).delay_compute("layers.0", 0.05)
    faults.at(rank=0, persistent=True).delay_collective(0.5, group="shard")
    faults.at(rank=0, step=1).skip_capture("layers.2")
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    faults.attach(model, opt, rank=0)
    t0 = time.monotonic()
    train_step(model, opt, 0, 0)
    assert time.monotonic() - t0 >= 0.05
    assert taps.comm_delay_s("shard") == 0.5
    assert taps.comm_delay_s("tp") == 0.0
    assert not taps.capture_vetoed("layers.2")  # step 0
    train_step(model, opt, 1, 0)
    assert taps.capture_vetoed("layers.2") and not taps.capture_vetoed("layers.1")
    faults.detach()
    assert taps.comm_delay_s("shard") == 0.0


def test_slow_compute_makes_each_forward_take_factor_times_as_long() -> None:
    # the block's work: a 0.1 s sleep at every step, which the slowdown at step 1 triples
    faults = Faults().at(rank=0, persistent=True).delay_compute("layers.0", 0.1)
    faults.at(rank=0, step=1).slow_compute("layers.0", 3.0)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    block = model.layers[0]
    marks: list[float] = []
    # timed from outside: a pre-hook before the injectors' (their work alone) and a hook
    # after them (the work with the slowdown's sleep)
    block.register_forward_pre_hook(lambda m, a: marks.append(time.perf_counter()))
    faults.attach(model, opt, rank=0)
    block.register_forward_hook(lambda m, a, o: marks.append(time.perf_counter()))
    took = []
    for s in range(3):
        marks.clear()
        train_step(model, opt, s, 0)
        took.append(marks[1] - marks[0])
    assert took[0] < 0.25 and took[2] < 0.25, took  # 0.1 s of work, not slowed
    assert 0.3 <= took[1] < 0.35, took  # 3x: the work and twice again (0.4 for 4x)
    assert [f for f in faults.fired() if f[0] == "slow"] == [("slow", "layers.0", 1)]
    faults.detach()
    marks.clear()
    train_step(model, opt, 3, 0)
    assert len(marks) == 2 and marks[1] - marks[0] < 0.05  # detached: no work, no sleep
    with pytest.raises(ValueError, match="at least 1"):
        Faults().at(rank=0, step=0).slow_compute("layers.0", 0.5)


def test_hang_freezes_the_step_once_at_its_first_forward() -> None:
    faults = Faults().at(rank=0, step=1).hang(0.3)
    faults.at(rank=1, step=0).hang(5.0)  # another rank's: never fires here
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    faults.attach(model, opt, rank=0)
    took = []
    for s in range(3):
        t0 = time.monotonic()
        model(batch(s, 0)[:, :-1])  # the step's first forward
        train_step(model, opt, s, 0)  # a second forward in the same step: no second freeze
        took.append(time.monotonic() - t0)
    assert took[1] >= 0.3
    assert faults.fired() == [("hang", None, 1)]  # once, at step 1, and not rank 1's
    faults.detach()
