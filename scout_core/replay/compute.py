"""The local part of a layer round: run the module on copies and sign what it computed.

Everything here happens on one peer, between the round's collectives (runner's step 5): for
each input variant (``0.1x, x, 10x``; integer inputs get only ``x``) the module runs on copies
of the parameters, buffers and inputs, under scoped deterministic mode with the agreed thread
count and the source's RNG states, and ``autograd.grad`` from the broadcast output gradients
yields input and parameter gradients without touching any live ``.grad``. The result: the exact
surfaces ``forward``, ``input_grad``, ``param_grad`` and the floating and integer output leaves
apart (``float_outputs``, ``int_outputs``: a router's weights and top-k indices), each ``None``
when empty although expected (the reason in ``gap``, :mod:`.gaps`), and the timing ``t_M``,
which ends only when the device has finished (:class:`~.scope.Interval`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scout_core.integration.adapter import RngStream
from scout_core.replay.capture import Capture, flatten, unflatten
from scout_core.replay.gaps import evidence, first_gap
from scout_core.replay.scope import Interval, deterministic_scope, device_of, rng_scope

__all__ = ["Call", "Inputs", "replay_module"]

Call = Callable[[nn.Module, dict[str, torch.Tensor], tuple[Any, ...], dict[str, Any]], Any]
"""How to run a module on a state dict (the adapter's ``call``, or the live module)."""


@dataclass
class Inputs:
    """What the source broadcast: the call's leaves, output gradients, RNG states."""

    leaves: list[Any]
    grads: list[torch.Tensor | None]
    rng: dict[str, torch.Tensor]


def _variant(x: Any, scale: float, requires_grad: bool) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    y = x * scale if (scale != 1.0 and x.is_floating_point()) else x.clone()
    return y.detach().requires_grad_(requires_grad and y.is_floating_point())


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in flatten(out)[0] if isinstance(t, torch.Tensor)]


def replay_module(
    module: nn.Module,
    cap: Capture,
    got: Inputs,
    params: dict[str, torch.Tensor],
    *,
    call: Call,
    variants: Sequence[float],
    rng: Sequence[RngStream],
    deterministic: bool,
    threads: int,
) -> dict[str, Any]:
    """Replay ``module`` on copies; the exact surfaces, ``t_M`` and the ``gap`` code."""
    named = dict(module.named_parameters())
    # TP attributes (DDP's TP transform) are not registered: their copy carries the flag.
    weights = {
        k: v.detach().requires_grad_(named[k].requires_grad if k in named else v.requires_grad)
        for k, v in params.items()
    }
    streams = [s for s in rng if s.name in got.rng]
    floating = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in got.leaves)
    runs = variants if floating else variants[:1]
    device = device_of([*params.values(), *got.leaves])
    timer = Interval(device)
    outs: list[torch.Tensor] = []
    in_grads: list[torch.Tensor | None] = []
    p_grads: list[torch.Tensor | None] = []
    wants_in = wants_params = False
    with (
        rng_scope(rng),
        deterministic_scope(deterministic, threads, cuda=device.type == "cuda"),
    ):
        for v in runs:
            for s in streams:
                s.set(got.rng[s.name])
            xs = [_variant(x, v, rg) for x, rg in zip(got.leaves, cap.requires_grad, strict=True)]
            args, kwargs = unflatten(xs, cap.spec)
            state: dict[str, torch.Tensor] = dict(weights)
            state.update({k: b.clone() for k, b in module.named_buffers()})
            with timer.timing():
                out = call(module, state, tuple(args), dict(kwargs))
                out_leaves = _tensors(out)
                outs.extend(out_leaves)
                pairs = [
                    (o, g)
                    for o, g in zip(out_leaves, got.grads, strict=False)
                    if g is not None and o.requires_grad
                ]
                wrt = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
                n_in = len(wrt)
                wrt += [w for w in weights.values() if w.requires_grad]
                if pairs and wrt:
                    wants_in = wants_in or n_in > 0
                    wants_params = wants_params or len(wrt) > n_in
                    grads = torch.autograd.grad(
                        [o for o, _ in pairs],
                        wrt,
                        grad_outputs=[g for _, g in pairs],
                        allow_unused=True,
                    )
                    in_grads.extend(grads[:n_in])
                    p_grads.extend(grads[n_in:])
    forward = evidence((o.detach() for o in outs), expected=True)

    def outputs_of_one_kind(part: list[torch.Tensor]) -> int | None:
        # When every output is of this kind, the part is the forward surface's tensors
        # in the same order: its signature is the forward one, already computed.
        if not part:
            return None
        return forward if len(part) == len(outs) else evidence(part, expected=True)

    values: dict[str, Any] = {
        "forward": forward,
        "float_outputs": outputs_of_one_kind([o.detach() for o in outs if o.is_floating_point()]),
        "int_outputs": outputs_of_one_kind([o for o in outs if not o.is_floating_point()]),
        "input_grad": evidence(in_grads, expected=wants_in),
        "param_grad": evidence(p_grads, expected=wants_params),
        "t_M": timer.seconds,
    }
    values["gap"] = int(first_gap(values))
    return values
