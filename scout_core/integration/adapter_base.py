"""What every framework adapter shares: RNG streams, optimizers and accessors.

Contract: a subclass adds only the layout, ``materialize`` and a hook-free ``call``; the
optimizers (stubs not listed), their steps per iteration, the RNG streams (CPU, CUDA, framework
trackers) and accessors live here. Adapters attach and count nothing: replay owns the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from scout_core.errors import UnsupportedSetupError
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

    replays_ep_blocks: bool = False
    """Whether a block with an expert-parallel MoE layer may stay in the rotation: True only if
    ``call`` re-points its all-to-all to SCOUT's groups (read with ``getattr``; absent: False)."""

    def __init__(
        self,
        *,
        rank: int,
        layout: MeshLayout,
        found: Discovered,
        optimizers: Sequence[torch.optim.Optimizer],
        steps_per_iteration: Sequence[int] | None = None,
        extra_rng: Iterable[RngStream] = (),
    ) -> None:
        self._rank = rank
        self._layout = layout
        self.found = found
        self._optimizers = tuple(optimizers)
        for opt in self._optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise UnsupportedSetupError(
                    f"{type(opt).__name__} is not a torch.optim.Optimizer; list the optimizers "
                    "inside the framework's wrappers"
                )
        steps = (1,) * len(self._optimizers) if steps_per_iteration is None else steps_per_iteration
        self._steps_per_iteration = tuple(int(n) for n in steps)
        if len(self._steps_per_iteration) != len(self._optimizers):
            raise ValueError("steps_per_iteration needs one count per optimizer")
        self._rng = default_rng_streams() + tuple(extra_rng)

    def close(self) -> None:
        """Nothing to remove here; subclasses remove what they attached."""

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
        return self._optimizers

    def steps_per_iteration(self) -> Sequence[int]:
        return self._steps_per_iteration

    def rng_streams(self) -> Sequence[RngStream]:
        return self._rng
