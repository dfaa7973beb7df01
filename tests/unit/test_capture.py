"""Capture on wrapped blocks and through an adapter's ``capture_copy``.

An activation-checkpointed block runs twice per iteration (forward, and again in
backward); its wrapper runs once. Capture hooks go on the wrapper when the
:class:`ModuleRef` names one, and every recorded tensor goes through the ref's
``capture_copy`` (how a TP adapter turns a sequence-sharded DTensor into the full
tensor), before a test's capture veto is consulted.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from scout_core.integration.adapter import ModuleRef
from scout_core.integration.discovery import discover
from scout_core.replay import taps
from scout_core.replay.capture import Capturer
from scout_core.testing.models import TinyLM, batch


def _model() -> TinyLM:
    torch.manual_seed(0)
    model = TinyLM(layers=2)
    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block)
    return model


def _iteration(model: nn.Module) -> None:
    tokens = batch(0, 0)
    logits = model(tokens[:, :-1])
    logits.sum().backward()


def _count_calls(module: nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_capture_hooks_the_wrapper_which_runs_once_per_forward() -> None:
    model = _model()
    ref = discover(model).layers[1]
    assert ref.outer is not None
    inner_calls, outer_calls = _count_calls(ref.module), _count_calls(ref.outer)
    capturer = Capturer([ref], [])
    capturer.arm(0, [ref.path])
    _iteration(model)
    assert (inner_calls[0], outer_calls[0]) == (2, 1)  # recompute in backward
    # only the counting hook on the block; the capture's two hooks sit on the wrapper
    assert len(ref.module._forward_pre_hooks) == 1 and not ref.module._forward_hooks
    assert len(ref.outer._forward_pre_hooks) == 2 and len(ref.outer._forward_hooks) == 1
    cap = capturer.take(ref.path)
    assert cap is not None and cap.complete() and len(cap.tensors) == 1
    assert cap.grads[0] is not None and cap.grads[0].shape == cap.tensors[0].shape
    capturer.close()
    assert len(ref.outer._forward_pre_hooks) == 1 and not ref.outer._forward_hooks


def test_every_recorded_tensor_goes_through_capture_copy() -> None:
    model = _model()
    seen: list[tuple[int, ...]] = []

    def copy(t: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(t.shape))
        return t.detach().clone() * 2

    found = discover(model).layers[0]
    ref = ModuleRef(found.path, found.module, outer=found.outer, capture_copy=copy)
    capturer = Capturer([ref], [])
    capturer.arm(0, [ref.path])
    recorded: list[torch.Tensor] = []
    ref.hooked.register_forward_pre_hook(lambda m, a: recorded.append(a[0].detach().clone()))
    _iteration(model)
    cap = capturer.take(ref.path)
    assert cap is not None and cap.complete()
    assert len(seen) == 2  # the input, then the output's gradient
    assert torch.equal(cap.tensors[0], recorded[0] * 2)
    capturer.close()


def test_a_failing_copy_drops_the_capture_not_the_step() -> None:
    model = _model()
    found = discover(model).layers[0]

    def broken(t: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no SCOUT group for this mesh dim")

    ref = ModuleRef(found.path, found.module, outer=found.outer, capture_copy=broken)
    capturer = Capturer([ref], [])
    capturer.arm(0, [ref.path])
    _iteration(model)  # training is not disturbed
    assert capturer.take(ref.path) is None
    capturer.close()


def test_a_vetoed_capture_still_makes_its_copy() -> None:
    model = _model()
    found = discover(model).layers[0]
    copies = [0]

    def copy(t: torch.Tensor) -> torch.Tensor:
        copies[0] += 1  # a TP copy is collective: the vetoed rank must still take part
        return t.detach().clone()

    ref = ModuleRef(found.path, found.module, outer=found.outer, capture_copy=copy)
    capturer = Capturer([ref], [])
    capturer.arm(0, [ref.path])
    remove = taps.add_capture_veto(lambda path: True)
    try:
        _iteration(model)
    finally:
        remove()
    assert copies[0] == 1 and capturer.take(ref.path) is None
    capturer.close()


class _Gate(nn.Module):
    """Returns routing weights and an auxiliary loss, as DeepSpeed's ``TopKGate`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.wg = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights = self.wg(x).softmax(-1)
        return weights, weights.square().mean()


def _gate_capture(copy: object = None) -> tuple[Capturer, str]:
    torch.manual_seed(0)
    gate = _Gate()
    ref = ModuleRef("gate", gate, capture_copy=copy)  # type: ignore[arg-type]
    capturer = Capturer([ref], [])
    capturer.arm(0, [ref.path])
    weights, _aux = gate(torch.randn(5, 4, requires_grad=True))
    weights.sum().backward()  # the model leaves the auxiliary loss out of its loss
    return capturer, ref.path


def test_an_output_backward_never_reached_has_no_gradient_and_the_capture_completes() -> None:
    capturer, path = _gate_capture()
    cap = capturer.take(path)
    assert cap is not None and cap.complete()
    assert cap.out_requires_grad == (True, True) and cap.grads_seen == [True, False]
    assert cap.grads[0] is not None and cap.grads[1] is None
    capturer.close()


def test_a_gradient_that_arrived_but_was_not_copied_leaves_the_capture_incomplete() -> None:
    calls = [0]

    def copy(t: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] > 1:  # the input copies; the output gradient's copy fails
            raise RuntimeError("no SCOUT group for this mesh dim")
        return t.detach().clone()

    capturer, path = _gate_capture(copy)
    assert capturer.take(path) is None
    capturer.close()
