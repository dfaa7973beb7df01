"""A rank's last replayed round, kept until the driver's referee phase is over.

Contract: :class:`Kept` holds what the round replayed (module, capture, received
inputs, materialised parameters, the referee digest of :mod:`.readiness`, thread
count); as a pair's source it says what to ship (:meth:`Kept.shipment`), as a referee
what a shipment must look like (:meth:`Kept.expected`). Wire format: :mod:`.referee_wire`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_core.integration.adapter import ModuleRef
from scout_core.replay.capture import Capture
from scout_core.replay.compute import Inputs
from scout_core.replay.referee_wire import Expected, Shipment
from scout_core.replay.schedule import Recipe

__all__ = ["Kept"]


@dataclass
class Kept:
    """This rank's last replayed round (module doc)."""

    recipe: Recipe
    step: int
    ref: ModuleRef
    cap: Capture
    got: Inputs
    params: dict[str, torch.Tensor]
    digest: int
    threads: int

    def shipment(self, step: int) -> Shipment | None:
        """What this rank, a pair's source, ships to the referee: its round at ``step``."""
        if self.step != step:
            return None
        got = self.got
        return Shipment(
            step=step,
            digest=self.digest,
            threads=self.threads,
            params={k: v.detach() for k, v in self.params.items()},
            inputs=[x for x in got.leaves if isinstance(x, torch.Tensor)],
            grads=[g for g in got.grads if g is not None],
            rng=dict(got.rng),
        )

    def expected(self, step: int) -> Expected | None:
        """What a shipment for this rank's own round at ``step`` must look like (None: no round)."""
        if self.step != step:
            return None
        cap = self.cap
        return Expected(
            step=step,
            digest=self.digest,
            # its own materialised parameters: the same names, dtypes and full shapes as
            # the source's (TP attributes DDP unregistered included)
            params={n: (p.dtype, tuple(p.shape)) for n, p in self.params.items()},
            inputs=[(x.dtype, tuple(x.shape)) for x in cap.leaves if isinstance(x, torch.Tensor)],
            grads=[(g.dtype, tuple(g.shape)) for g in cap.grads if g is not None],
            rng={k: (v.dtype, tuple(v.shape)) for k, v in cap.rng.items()},
        )
