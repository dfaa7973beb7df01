"""What every framework adapter shares: the step counter, RNG streams and accessors.

A plugin's adapter (plain PyTorch, DeepSpeed, ...) differs in how it derives the
layout, materialises parameters and calls a module without framework hooks. The
rest of the :class:`~scout_core.integration.adapter.FrameworkAdapter` lifecycle is the same
everywhere and lives here once: counting optimizer steps through a post-step hook
on the base optimizer, the RNG streams replay reproduces (CPU, the current CUDA
device, plus framework trackers), and the accessors over the layout and the
discovered modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from scout_core.integration.adapter import ModuleRef, RngStream
from scout_core.integration.discovery import Discovered
from scout_core.topology.mesh import MeshAddress, MeshLayout

__all__ = ["AdapterBase", "cpu_rng", "default_rng_streams", "device_rng"]


def cpu_rng() -> RngStream:
    """The default CPU generator."""
    return RngStream("cpu", torch.get_rng_state, torch.set_rng_state)


def device_rng() -> RngStream | None:
    """The current CUDA device's generator, when CUDA is available."""
    if not torch.cuda.is_available():
        return None
    return RngStream("cuda", torch.cuda.get_rng_state, torch.cuda.set_rng_state)


def default_rng_streams() -> tuple[RngStream, ...]:
    """The CPU stream, and the device stream where there is a device."""
    dev = device_rng()
    return (cpu_rng(),) if dev is None else (cpu_rng(), dev)


class AdapterBase:
    """The shared part of an adapter; subclasses add layout, materialise and call."""

    def __init__(
        self,
        *,
        rank: int,
        layout: MeshLayout,
        found: Discovered,
        optimizer: torch.optim.Optimizer,
        extra_rng: Iterable[RngStream] = (),
    ) -> None:
        self._rank = rank
        self._layout = layout
        self.found = found
        self.optimizer = optimizer
        self._steps = 0
        self._handle = optimizer.register_step_post_hook(self._count)
        self._rng = default_rng_streams() + tuple(extra_rng)

    def _count(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._steps += 1

    def close(self) -> None:
        """Remove the step counter (subclasses remove what they attached, then call this)."""
        self._handle.remove()

    def layout(self) -> MeshLayout:
        return self._layout

    def rank(self) -> int:
        return self._rank

    def address(self) -> MeshAddress:
        return self._layout.address(self._rank)

    def repeated_layers(self) -> Sequence[ModuleRef]:
        return self.found.layers

    def special_modules(self) -> Mapping[str, ModuleRef]:
        return self.found.special()

    def optimizers(self) -> Sequence[torch.optim.Optimizer]:
        return (self.optimizer,)

    def rng_streams(self) -> Sequence[RngStream]:
        return self._rng

    def step(self) -> int:
        return self._steps
