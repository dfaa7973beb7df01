"""Megatron's RNG streams as (name, get, set), and how activation recompute is recognised.

[Streams]
Replay must draw the same random numbers on every peer and leave training's streams
as they were. Besides torch's CPU generator and the current CUDA generator (the
core's default streams), Megatron keeps named streams in
``tensor_parallel.get_cuda_rng_tracker()``: ``model-parallel-rng`` (seed + 2718 +
TP rank: different across TP ranks, equal across DP replicas; attention dropout
forks it), ``data-parallel-rng`` (seed) and ``expert-parallel-rng`` (seed + 1024 +
100 x EP rank + expert-TP rank). They are exactly the set Megatron-LM checkpoints
(``get_rng_state``) and ``RerunStateMachine`` restores.

A plain ``CudaRNGStatesTracker`` holds each state as a CPU ``uint8`` tensor and
*replaces* it when a ``fork()`` ends; the graph-safe and TE trackers hold
``torch.Generator`` objects that advance in place. :func:`tracker_streams` reads
and writes through ``get_states()`` / ``set_states()`` either way and always hands
out a CPU ``uint8`` copy, so a captured state never aliases the live one.

[Activation recompute]
With ``recompute_granularity='full'`` the transformer block runs layers through
``tensor_parallel.checkpoint`` (``CheckpointFunction``): once in forward under
``torch.no_grad()``, and again during backward, with grad enabled, to rebuild the
activations. Both runs fire the layer's forward hooks, and Megatron's
``is_checkpointing()`` is True in both. The *second* firing is recognised by
:func:`in_recompute`: inside ``is_checkpointing()`` with grad enabled, or whenever
the autograd engine is running a backward pass (the recompute of
``CheckpointWithoutOutput`` and TE's checkpoint do not set Megatron's flag but do
run inside backward). Selective recompute (``core_attn``, ``mlp``, ``layernorm`` ...)
re-runs submodules only, so hooks on whole layers fire once.
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
    """One :class:`TrackerStream` per state of the tracker, sorted by name.

    ``tracker`` defaults to ``tensor_parallel.get_cuda_rng_tracker()``. Names are
    prefixed ``megatron:`` so they cannot collide with the core's ``cpu``/``cuda``.
    An uninitialised or inference tracker has no states and gives no streams.
    """
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
