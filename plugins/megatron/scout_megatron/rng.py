"""Megatron's RNG streams as (name, get, set), and how activation recompute is recognised.

Contract: :func:`tracker_streams` gives every stream of Megatron's CUDA RNG tracker as a
:class:`TrackerStream` whose getter returns a CPU ``uint8`` copy (plain or generator-backed
trackers); :func:`in_recompute` is true on the second (backward) firing of a layer under full
activation recompute. Docs: docs/megatron.md, "RNG and activation recompute".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = ["TrackerStream", "in_recompute", "tracker_streams"]


class TrackerStream(NamedTuple):
    """One named stream of Megatron's RNG tracker (the shape of the core's ``RngStream``)."""

    name: str
    get: Callable[[], torch.Tensor]
    set: Callable[[torch.Tensor], None]


def _state_bytes(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Generator):
        value = value.get_state()
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"unexpected RNG tracker state of type {type(value).__name__}")
    return value.detach().to("cpu", copy=True).contiguous().view(torch.uint8)


def _stream(tracker: Any, name: str) -> TrackerStream:
    def get() -> torch.Tensor:
        return _state_bytes(tracker.get_states()[name])

    def set_(state: torch.Tensor) -> None:
        states = tracker.get_states()
        current = states[name]
        if isinstance(current, torch.Generator):
            current.set_state(state.to("cpu").clone())
            return
        states[name] = state.to(device=current.device, dtype=current.dtype).clone()
        tracker.set_states(states)

    return TrackerStream(f"megatron:{name}", get, set_)


def tracker_streams(tracker: Any = None) -> list[TrackerStream]:
    """One :class:`TrackerStream` per tracker state, sorted by name; ``megatron:``-prefixed so
    names cannot collide with the core's ``cpu``/``cuda``. ``tracker`` defaults to
    ``tensor_parallel.get_cuda_rng_tracker()``; an uninitialised or inference one gives none."""
    if tracker is None:
        from megatron.core import tensor_parallel

        tracker = tensor_parallel.get_cuda_rng_tracker()
    return [_stream(tracker, name) for name in sorted(tracker.get_states())]


def _in_backward() -> bool:
    # torch exposes no public query for "the autograd engine is running"; this is the
    # one torch.utils.checkpoint itself uses (-1 outside backward).
    current = getattr(torch._C, "_current_graph_task_id", None)
    return callable(current) and int(current()) != -1


def in_recompute() -> bool:
    """True while a hook fires for activation recompute, not for the forward pass itself."""
    from megatron.core.tensor_parallel.random import is_checkpointing

    if is_checkpointing() and torch.is_grad_enabled():
        return True
    return _in_backward()
