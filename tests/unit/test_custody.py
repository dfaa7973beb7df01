"""Parameter custody (scout_core.replay.custody), in one process: the rotation covers
every local parameter within ``slices`` steps, a change between two steps is named,
clean training and SCOUT's own restores are not, and ZeRO's narrowed or swapped
parameter groups are signed and checked with the step that writes them."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import pytest
import torch
from torch import nn

from scout_core.checkpoint.catalog import GateCatalog
from scout_core.decision.c3 import C3Result
from scout_core.decision.gate import Action, Gate, Outcome
from scout_core.decision.gate_wire import merge_flags
from scout_core.records.record import Record
from scout_core.replay.boundary import Boundary
from scout_core.replay.custody import SLOT_SURFACE, SURFACE, Custody, Violation
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import HIDDEN, Recipe
from scout_core.testing.injectors import BitFlip, Faults, flip_bit
from scout_core.testing.models import TinyLM, train_step
from scout_core.vocabulary import Failure, Mode, Scope, Status


class _Clock:
    """The replay driver's iteration counter, advanced after each step by the test."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self) -> int:
        return self.step


def _train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    custody: Custody,
    clock: _Clock,
    steps: int,
    *,
    after: Callable[[int], None] = lambda step: None,
) -> list[Violation]:
    found: list[Violation] = []
    for _ in range(steps):
        train_step(model, opt, clock.step, 0)
        after(clock.step)
        found += custody.collect()  # the driver collects at the boundary
        clock.step += 1
    return found


def _setup(
    *, layers: int, slices: int, every: int = 1, adamw_lr: float | None = None
) -> tuple[nn.Module, torch.optim.Optimizer, _Clock, Custody]:
    """TinyLM (dim 8), its optimizer (SGD at 0.1, or AdamW at ``adamw_lr``), the clock
    and the custody over them."""
    model = TinyLM(dim=8, layers=layers)
    opt: torch.optim.Optimizer
    if adamw_lr is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=adamw_lr)
    clock = _Clock()
    return model, opt, clock, Custody([opt], slices=slices, every=every, step=clock)


def _signed(custody: Custody, key: str = "") -> dict[int, tuple[int, int]]:
    """id(parameter) -> the range its current seal covers (of its slot ``key``, or of the
    parameter itself)."""
    return {pid: (s.lo, s.hi) for (pid, k), s in custody._seals.items() if k == key}


def coverage_gaps(custody: Custody, opt: torch.optim.Optimizer, clock: _Clock) -> list[str]:
    """Elements of any parameter not signed in ``custody.slices`` consecutive steps."""
    params = [p for g in opt.param_groups for p in g["params"]]
    seen = {id(p): torch.zeros(p.numel(), dtype=torch.bool) for p in params}
    for _ in range(custody.slices):
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        for pid, (lo, hi) in _signed(custody).items():
            seen[pid][lo:hi] = True
        custody.collect()
        clock.step += 1
    return [
        f"param {i}: {int((~seen[id(p)]).sum())} elements never signed"
        for i, p in enumerate(params)
        if not bool(seen[id(p)].all())
    ]


@pytest.mark.parametrize("slices", [1, 3, 7, 64, 1000])
def test_rotation_covers_every_parameter_within_slices_steps(slices: int) -> None:
    model, opt, clock, custody = _setup(layers=3, slices=slices)
    assert custody.total == sum(p.numel() for p in model.parameters())
    assert coverage_gaps(custody, opt, clock) == []
    # No step signs more than one slice's worth.
    opt.step()
    assert sum(s.hi - s.lo for s in custody._seals.values()) <= custody.width()


@pytest.mark.parametrize(("slices", "every"), [(8, 4), (7, 3), (64, 16), (5, 9), (6, 1)])
def test_custody_every_signs_only_at_its_steps_and_still_covers_the_rotation(
    slices: int, every: int
) -> None:
    _model, opt, clock, custody = _setup(layers=3, slices=slices, every=every)
    assert custody.every == min(every, slices)  # a larger every acts as slices
    assert custody.windows * custody.every <= slices  # the rotation fits in slices steps
    assert coverage_gaps(custody, opt, clock) == []
    params = [p for g in opt.param_groups for p in g["params"]]
    for _ in range(2 * slices):
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        seals = list(custody._seals.values())
        working = clock.step % custody.every == 0
        # a working step signs (one range's worth); the others only check what it signed
        assert bool(seals) == working, (clock.step, seals)
        assert all(s.step == clock.step for s in seals)
        assert sum(s.hi - s.lo for s in seals) <= custody.width()
        custody.collect()
        clock.step += 1


def test_a_planted_skip_in_the_rotation_is_a_coverage_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    _model, opt, clock, custody = _setup(layers=3, slices=5)
    span = custody.span
    # A rotation that never signs slice 2: the coverage check must say so.
    monkeypatch.setattr(
        custody, "span", lambda off, n, index: None if index == 2 else span(off, n, index)
    )
    gaps = coverage_gaps(custody, opt, clock)
    assert gaps, "a rotation that skips a slice must leave elements unsigned"


def test_forty_clean_steps_give_no_violation() -> None:
    torch.manual_seed(0)
    model, opt, clock, custody = _setup(layers=2, slices=4, adamw_lr=1e-3)
    assert _train(model, opt, custody, clock, 40) == []
    assert custody.checked > 0  # custody compared pieces: the silence is a pass, not a skip


@pytest.mark.parametrize("seed", range(8))
def test_a_flip_after_the_step_is_named_within_one_rotation(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = TinyLM(dim=16, layers=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    clock = _Clock()
    slices = rng.choice([1, 4, 9])
    every = rng.choice([e for e in (1, 2, 3) if e <= slices])
    custody = Custody([opt], slices=slices, every=every, step=clock)
    names = [n for n, _ in model.named_parameters()]
    name = rng.choice(names)
    param = model.get_parameter(name)
    index = rng.randrange(param.numel())
    start = rng.randrange(3, 8)
    print(f"seed={seed} slices={slices} every={every} param={name} index={index} from {start}")
    faults = Faults()
    faults.at(rank=0, steps=range(start, 10_000)).corrupt_param_after_step(
        name, BitFlip(bit=3, index=index)
    )
    faults.attach(model, opt, rank=0)  # after custody: its post-hook runs second
    found = _train(model, opt, custody, clock, start + slices + 1)
    assert found, "a weight that changes after every write must be named within a rotation"
    first = found[0]
    assert start < first.step <= start + slices
    held = first.held
    assert held.tensor is param
    assert first.seal.lo <= index < first.seal.hi
    assert first.signed != first.found
    records = custody.records(found, run_id="r", rank=3, hosts={3: "h3"})
    rec = records[0]
    assert (rec.surface, rec.failure, rec.status, rec.scope) == (
        SURFACE,
        Failure.SDC,
        Status.ATTRIBUTED,
        Scope.RANK,
    )
    assert rec.outliers == (3,) and rec.group == (3,) and rec.hosts == ("h3",)
    assert rec.detail["signed_step"] == first.step - 1
    assert rec.detail["elements"] == [first.seal.lo, first.seal.hi]


def test_adam_slots_join_the_rotation_and_are_covered_within_slices_steps() -> None:
    model, opt, clock, custody = _setup(layers=3, slices=7, adamw_lr=1e-3)
    n = sum(p.numel() for p in model.parameters())
    assert custody.total == n  # no optimizer state before the first step
    _train(model, opt, custody, clock, 1)
    assert custody.total == 3 * n  # the parameters, exp_avg and exp_avg_sq
    params = [p for g in opt.param_groups for p in g["params"]]
    for key in ("exp_avg", "exp_avg_sq"):
        assert all(opt.state[p][key].numel() == p.numel() for p in params)
    seen = {
        k: {id(p): torch.zeros(p.numel(), dtype=torch.bool) for p in params}
        for k in ("", "exp_avg", "exp_avg_sq")
    }
    for _ in range(custody.slices):
        _train(model, opt, custody, clock, 1)
        for key, marks in seen.items():
            for pid, (lo, hi) in _signed(custody, key).items():
                marks[pid][lo:hi] = True
    gaps = [
        (k, i)
        for k, marks in seen.items()
        for i, p in enumerate(params)
        if not bool(marks[id(p)].all())
    ]
    assert gaps == []
    assert not any(k == "step" for _, k in custody._seals)  # a scalar slot is not held


@pytest.mark.parametrize("seed", range(4))
def test_a_moment_that_changes_after_every_step_is_named_on_the_slot_surface(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = TinyLM(dim=16, layers=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    clock = _Clock()
    slices = rng.choice([1, 4, 9])
    custody = Custody([opt], slices=slices, step=clock)
    name = rng.choice([n for n, _ in model.named_parameters()])
    param = model.get_parameter(name)
    key = rng.choice(["exp_avg", "exp_avg_sq"])
    index = rng.randrange(param.numel())
    start = rng.randrange(2, 6)
    print(f"seed={seed} slices={slices} param={name} slot={key} index={index} from {start}")
    faults = Faults()
    faults.at(rank=0, steps=range(start, 10_000)).corrupt_optimizer_state_after_step(
        name, BitFlip(bit=20, index=index), key=key
    )
    faults.attach(model, opt, rank=0)  # after custody: its post-hook runs second
    found = _train(model, opt, custody, clock, start + slices + 1)
    assert found, "a slot that changes after every write must be named within a rotation"
    first = found[0]
    assert start < first.step <= start + slices
    assert (first.held.tensor, first.held.key) == (param, key)
    assert first.seal.lo <= index < first.seal.hi
    rec = custody.records(found, run_id="r", rank=1, hosts={})[0]
    assert (rec.surface, rec.failure, rec.scope, rec.outliers) == (
        SLOT_SURFACE,
        Failure.SDC,
        Scope.RANK,
        (1,),
    )
    assert rec.detail["slot"] == key and "optimizer state" in rec.detail["reason"]
    # Only the struck tensor: the parameter itself was written by the step alone.
    assert {(v.held.tensor is param, v.held.key) for v in found} == {(True, key)}


def test_a_one_time_flip_outside_the_signed_slice_is_not_seen() -> None:
    """The documented limit: custody checks only what it signed at the last write."""
    model, opt, clock, custody = _setup(layers=2, slices=4)
    first = next(iter(model.parameters()))  # its elements open the rotation: slice 0
    last = list(model.parameters())[-1]  # the end of the rotation: slice 3

    def flip(step: int) -> None:
        if step == 0:
            flip_bit(last, index=last.numel() - 1, bit=2)  # outside slice 0: unseen
        if step == 4:
            flip_bit(first, index=0, bit=2)  # slice 4 % 4 == 0: seen at step 5

    found = _train(model, opt, custody, clock, 6, after=flip)
    assert [v.step for v in found] == [5]
    assert found[0].held.tensor is first


def test_forget_drops_signatures_so_a_restore_is_not_a_violation() -> None:
    model, opt, clock, custody = _setup(layers=2, slices=1)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def restore(step: int) -> None:
        if step == 2:
            model.load_state_dict(saved)  # SCOUT's restore calls forget() after this
            custody.forget()

    assert _train(model, opt, custody, clock, 5, after=restore) == []

    def unannounced(step: int) -> None:
        if step == 6:
            model.load_state_dict(saved)  # a write custody was not told of

    found = _train(model, opt, custody, clock, 3, after=unannounced)
    assert {v.step for v in found} == {7}  # slices=1: every parameter that the load moved
    assert len(found) == sum(1 for p in model.parameters())


def test_a_checkpoint_load_with_optimizer_state_is_not_a_violation() -> None:
    # What a framework's load_checkpoint does mid-run (a rollback): the model's and the
    # optimizer's state from an earlier step. The optimizer's load_state_dict clears
    # custody (its post-hook), whichever of the two is loaded first.
    torch.manual_seed(0)
    model, opt, clock, custody = _setup(layers=2, slices=1, adamw_lr=1e-2)
    assert _train(model, opt, custody, clock, 2) == []
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))

    def load(step: int, model_first: bool) -> None:
        if step in (4, 7):
            if model_first:
                model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
            if not model_first:
                model.load_state_dict(saved[0])

    assert _train(model, opt, custody, clock, 4, after=lambda s: load(s, True)) == []
    assert _train(model, opt, custody, clock, 4, after=lambda s: load(s, False)) == []
    assert custody.checked > 0
    custody.close()
    assert not opt._optimizer_load_state_dict_post_hooks  # close() removes it too


def test_slices_zero_registers_no_hook() -> None:
    model = TinyLM(dim=8, layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    custody = Custody([opt], slices=0, step=lambda: 0)
    assert not custody.enabled
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert not opt._optimizer_load_state_dict_post_hooks
    with pytest.raises(ValueError, match="slices"):
        Custody([opt], slices=-1, step=lambda: 0)


class _NarrowingOptimizer:
    """How DeepSpeed's ZeRO steps the inner optimizer: once per group, with
    ``param_groups`` narrowed to that group (ZeRO 1/2) or the group's flat tensor
    swapped in and out (ZeRO-3); custody sees only what the step holds."""

    def __init__(self, tensors: list[torch.Tensor], *, swap: bool) -> None:
        self.flat = tensors
        self.swap = swap
        self.inner = torch.optim.SGD([{"params": [t]} for t in tensors], lr=0.1)
        self.groups = list(self.inner.param_groups)
        if swap:
            for g in self.groups:
                g["params"] = []

    def step(self) -> None:
        for i, t in enumerate(self.flat):
            t.grad = torch.full_like(t, 0.01)
            if self.swap:
                self.groups[i]["params"] = [t]
                self.inner.step()
                self.groups[i]["params"] = []
            else:
                self.inner.param_groups = [self.groups[i]]
                self.inner.step()
                self.inner.param_groups = self.groups


@pytest.mark.parametrize("swap", [False, True], ids=["zero12-narrowed", "zero3-swapped"])
def test_zero_style_group_steps_are_signed_and_checked(swap: bool) -> None:
    tensors = [torch.randn(n) for n in (1000, 37, 500)]
    opt = _NarrowingOptimizer(tensors, swap=swap)
    clock = _Clock()
    custody = Custody([opt.inner], slices=3, step=clock)
    assert custody.total == (0 if swap else 1537)
    seen = [torch.zeros(t.numel(), dtype=torch.bool) for t in tensors]
    for _ in range(4):  # the first step discovers swapped-in tensors; then 3 = one rotation
        opt.step()
        for i, t in enumerate(tensors):
            seal = custody._seals.get((id(t), ""))
            if seal is not None and clock.step >= 1:
                seen[i][seal.lo : seal.hi] = True
        assert custody.collect() == []
        clock.step += 1
    assert custody.total == 1537
    assert all(bool(s.all()) for s in seen)
    # A change to the middle group's flat tensor between its steps is named.
    for _ in range(3):
        opt.step()
        flip_bit(tensors[1], index=5, bit=1)
        clock.step += 1
    found = custody.collect()
    assert found and {v.held.tensor is tensors[1] for v in found} == {True}


# -- the checkpoint gate ------------------------------------------------------------------


def _custody_record(rank: int, step: int) -> Record:
    model, opt, clock, custody = _setup(layers=1, slices=1)

    def flip(s: int) -> None:
        if s == step - 1:
            flip_bit(next(iter(model.parameters())), index=0, bit=0)

    clock.step = step - 1
    found = _train(model, opt, custody, clock, 2, after=flip)
    return custody.records(found, run_id="r", rank=rank, hosts={})[0]


def test_the_gate_treats_a_custody_verdict_as_a_localized_sdc() -> None:
    """Algorithm 3: the rank whose custody verdict named it reports SDC at the next
    boundary where the gate decides, so the job-wide decision is a retrieval of verified
    state, like an attributed exact surface; without it the same boundary is clean."""
    hidden = Recipe(HIDDEN, "layers.0", 0)
    catalog = GateCatalog((hidden, Recipe(HIDDEN, "layers.1", 1)), 2)
    agree = C3Result(
        "layer/layers.0/forward", Mode.EXACT, Status.AGREE, (False, False), (1, 1), (0, 1)
    )
    clean_round = RoundOutcome(hidden, 8, (0, 1), True, {agree.surface: agree})
    record = _custody_record(rank=1, step=7)
    assert record.step == 7 and record.outliers == (1,)
    plain = Boundary(8, (hidden,), (clean_round,))
    assert catalog.evaluate(plain) == (Outcome.CLEAN, [0])
    held = Boundary(8, (hidden,), (clean_round,), (record,))
    assert catalog.evaluate(held) == (Outcome.SDC, [0])
    # Job-wide: rank 0 clean, rank 1 (the named one) SDC -> retrieve verified.
    gate = Gate(2)
    ranks = []
    for b in (plain, held):
        found = catalog.evaluate(b)
        assert found is not None
        ranks.append(gate.local_flags(8, *found))
    decision = gate.decide(merge_flags(ranks), ranks[0])
    assert decision.action is Action.RETRIEVE and decision.failure is Failure.SDC
    # Nothing due for the gate: it decides nothing, and the verdict waits for a due boundary.
    assert catalog.evaluate(Boundary(9, (), (), (record,))) is None
