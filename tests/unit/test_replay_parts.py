"""Replay's local parts without a process group: missing evidence, instance-level
``forward`` overrides, control-flow counts, capture hooks and the execution scope."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from torch import nn

from scout_core.decision.c3 import C3Result
from scout_core.errors import ConfigError
from scout_core.integration.adapter import ModuleRef
from scout_core.plugin.torch_adapter import hook_free_twin
from scout_core.replay.capture import Capturer
from scout_core.replay.compute import Inputs, replay_module
from scout_core.replay.control import ControlFlow
from scout_core.replay.gaps import Gap, evidence
from scout_core.replay.overrides import instance_forwards, live_call_hazard
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import HIDDEN, Recipe
from scout_core.replay.scope import Interval, deterministic_scope
from scout_core.replay.verdicts import VerdictMaker
from scout_core.testing.models import Block
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Mode, Status

GROUP = (0, 1, 2, 3)


def _maker() -> VerdictMaker:
    return VerdictMaker(
        run_id="t", hosts=dict.fromkeys(GROUP, "h"), rounds=2, min_excess_s=0.05, min_ratio=1.5
    )


def _result(surface: str, evidence: tuple[Any, ...], status: Status) -> C3Result:
    return C3Result(surface, Mode.EXACT, status, (False,) * len(GROUP), evidence, GROUP)


# -- missing evidence --------------------------------------------------------------------


def test_an_empty_evidence_list_is_no_evidence() -> None:
    assert evidence([], expected=True) is None
    assert evidence([None, None], expected=True) is None
    assert evidence([], expected=False) is not None  # nothing to compare, on every peer
    assert evidence([torch.ones(2), None], expected=True) is not None


def test_empty_evidence_on_one_rank_reads_inconclusive_with_the_reason() -> None:
    """Issue 10 item 2: rank 3's replay produced no parameter gradients. Its param_grad is
    missing (C3: inconclusive on every peer), never compared as the constant signature
    of an empty list, and the round says why, without naming anyone as a culprit."""
    recipe = Recipe(HIDDEN, "layers.1", 1)
    empty = evidence([], expected=True)
    assert empty is None
    results = {
        "layer/layers.1/forward": _result("layer/layers.1/forward", (7, 7, 7, 7), Status.AGREE),
        "layer/layers.1/param_grad": _result(
            "layer/layers.1/param_grad", (5, 5, 5, empty), Status.INCONCLUSIVE
        ),
        "layer/layers.1/gap": _result(
            "layer/layers.1/gap", (0, 0, 0, int(Gap.NO_PARAM_GRADS)), Status.ATTRIBUTED
        ),
    }
    records = _maker().judge(RoundOutcome(recipe, 4, GROUP, True, results, source=0))
    assert [(r.surface, r.status, r.failure, r.outliers) for r in records] == [
        ("layer/layers.1/gap", Status.INCONCLUSIVE, None, ())
    ]
    assert records[0].detail["missing"] == {
        "3": "the replay produced no parameter gradients (param_grad)"
    }


def test_a_complete_surface_is_still_compared_when_another_is_missing() -> None:
    recipe = Recipe(HIDDEN, "layers.1", 1)
    results = {
        "layer/layers.1/forward": C3Result(
            "layer/layers.1/forward",
            Mode.EXACT,
            Status.ATTRIBUTED,
            (False, True, False, False),
            (7, 8, 7, 7),
            GROUP,
        ),
        "layer/layers.1/gap": _result(
            "layer/layers.1/gap", (0, 0, 0, int(Gap.NO_INPUT_GRADS)), Status.ATTRIBUTED
        ),
    }
    records = _maker().judge(RoundOutcome(recipe, 4, GROUP, True, results, source=0))
    assert {(r.surface, r.outliers) for r in records} == {
        ("layer/layers.1/gap", ()),
        ("layer/layers.1/forward", (1,)),
    }


# -- instance-level forward overrides ----------------------------------------------------


def _wrapped_block() -> Block:
    torch.manual_seed(0)
    block = Block(8)
    inner = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs) + 1.0

    block.forward = forward  # type: ignore[method-assign]
    return block


def test_instance_forwards_and_hazards() -> None:
    block = _wrapped_block()
    assert instance_forwards(block) == [""]
    assert instance_forwards(Block(8)) == []
    ddp = MeshLayout.from_order("d", d=4)
    dptp = MeshLayout.from_order("t-d", d=2, t=2)
    assert live_call_hazard(block, ddp) is None
    hazard = live_call_hazard(block, dptp)
    assert hazard is not None and "tensor parallelism" in hazard


def _replay(block: nn.Module, call: Any) -> dict[str, Any]:
    x = torch.randn(2, 3, 8)
    block.eval()  # no dropout: the outcome does not depend on an RNG stream
    return _replay_on(block, x, [torch.ones(2, 3, 8)], call=call, input_grad=True)


def _replay_on(
    module: nn.Module,
    x: torch.Tensor,
    grads: list[torch.Tensor],
    *,
    call: Any = torch.func.functional_call,
    input_grad: bool = False,
) -> dict[str, Any]:
    from scout_core.replay.capture import Capture, flatten

    _, spec = flatten(((x,), {}))
    cap = Capture("m", 0, [x], spec, (input_grad,), {})
    params = {k: v.detach().clone() for k, v in module.named_parameters()}
    return replay_module(
        module,
        cap,
        Inputs([x], list(grads), {}),
        params,
        call=call,
        variants=(1.0,),
        rng=[],
        deterministic=True,
        threads=1,
    )


def test_a_wrapper_on_a_twin_loses_the_parameter_gradients() -> None:
    """The bug of issue 10 item 2: the twin inherits the wrapper, which calls the live
    module's bound forward with the live parameters: the replay's own parameters get no
    gradient. That is a gap, not a value."""
    block = _wrapped_block()
    twin_call = lambda m, s, a, k: torch.func.functional_call(hook_free_twin(m), s, a, k)  # noqa: E731
    broken = _replay(block, twin_call)
    assert broken["param_grad"] is None and broken["gap"] == Gap.NO_PARAM_GRADS
    live = _replay(block, torch.func.functional_call)
    assert live["param_grad"] is not None and live["gap"] == Gap.NONE
    assert live["forward"] is not None


class _Router(nn.Module):
    """A router-like module: routing weights (floating) and top-k indices (integer)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, index = torch.topk(self.proj(x).softmax(-1), 2, dim=-1)
        return weights, index


def test_the_output_kind_surfaces_sign_what_they_name() -> None:
    """The router surfaces sign the floating and the integer outputs apart, each equal to
    the signature of those outputs computed outside replay; where every output is
    floating, the floating part is the forward surface's value."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    router = _Router().eval()
    with torch.no_grad():
        weights, index = router(x)
    got = _replay_on(router, x, [torch.ones_like(weights)])
    assert got["forward"] == evidence([weights, index], expected=True)
    assert got["float_outputs"] == evidence([weights], expected=True)
    assert got["int_outputs"] == evidence([index], expected=True)
    assert len({got["forward"], got["float_outputs"], got["int_outputs"]}) == 3

    block = Block(8).eval()
    with torch.no_grad():
        out = block(x)
    plain = _replay_on(block, x, [torch.ones_like(out)])
    assert plain["forward"] == plain["float_outputs"] == evidence([out], expected=True)
    assert plain["int_outputs"] is None


# -- control flow --------------------------------------------------------------------------


def test_an_optimizer_step_without_a_forward_is_an_extra_step() -> None:
    marker = nn.Linear(2, 2)
    flow = ControlFlow(marker)
    assert flow.iterating  # nothing seen yet: the first step starts an iteration
    assert flow.boundary() is False  # no forward seen ever: cannot tell, keep counting
    for _ in range(2):  # two micro-batches
        marker(torch.ones(1, 2))
    assert flow.iterating
    assert flow.boundary() is False
    assert not flow.iterating
    assert flow.boundary() is True  # an extra step: no forward since the last boundary
    with torch.no_grad():
        marker(torch.ones(1, 2))  # evaluation is not training
    assert flow.boundary() is True
    marker(torch.ones(1, 2))
    assert flow.boundary() is False
    assert flow.take() == (2, 3)  # two extra steps, three training forwards
    assert flow.take() == (0, 0)
    flow.close()
    marker(torch.ones(1, 2))
    assert flow.boundary() is True  # the hook is gone: no forward counted


# -- capture hooks --------------------------------------------------------------------------


def test_capture_hooks_exist_only_while_armed() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    refs = [ModuleRef("0", model[0]), ModuleRef("1", model[1])]
    capturer = Capturer(refs, [])
    assert capturer.hooked == () and not model[0]._forward_pre_hooks
    capturer.arm(3, ["1"])
    assert capturer.hooked == ("1",)
    assert len(model[1]._forward_pre_hooks) == 1 and len(model[1]._forward_hooks) == 1
    model(torch.ones(1, 2, requires_grad=True)).sum().backward()
    assert capturer.take("1") is not None
    capturer.arm(4, [])
    assert capturer.hooked == ()
    assert not model[1]._forward_pre_hooks and not model[1]._forward_hooks
    capturer.arm(5, ["0", "1"])
    capturer.close()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model)


# -- scope ----------------------------------------------------------------------------------


def test_deterministic_scope_refuses_cuda_without_a_cublas_workspace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with (
        pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG"),
        deterministic_scope(True, torch.get_num_threads(), cuda=True),
    ):
        pass
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    with deterministic_scope(True, torch.get_num_threads(), cuda=True):
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_interval_on_the_cpu_is_the_monotonic_clock() -> None:
    timer = Interval()
    with timer.timing():
        time.sleep(0.02)
    with timer.timing():
        time.sleep(0.02)
    assert 0.03 < timer.seconds < 1.0
