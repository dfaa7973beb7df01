"""The adapter protocol: what a framework plugin tells the core about a training job.

Contract: a :class:`FrameworkAdapter` gives the few facts replay, the observer and the gate
need, so the core never imports a framework; adapters do not count steps. The protocol is
structural; :class:`~.adapter_base.AdapterBase` holds the shared part and
:func:`scout_core.testing.conformance.check_adapter` checks every plugin (docs/plugins.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from scout_core.topology.groups import PeerGroup
    from scout_core.topology.mesh import MeshAddress, MeshLayout

__all__ = [
    "ROLES",
    "FrameworkAdapter",
    "ModuleRef",
    "Ownership",
    "RngStream",
    "moe_modules",
    "role_of",
]

ROLES = ("embedding", "lm_head", "router", "experts")
"""The roles ``special_modules()`` may report; MoE keys are ``router:<i>`` / ``experts:<i>``
for the ``i``-th MoE layer in model order."""


def role_of(key: str) -> str:
    """The role of a ``special_modules()`` key: ``"experts:1"`` → ``"experts"``."""
    return key.partition(":")[0]


def moe_modules(
    special: Mapping[str, ModuleRef],
) -> tuple[tuple[ModuleRef, ...], tuple[ModuleRef, ...]]:
    """The MoE routers and expert containers of ``special_modules()``, each in MoE-layer
    order (the ``:<i>`` suffix; a bare ``router`` / ``experts`` key counts as layer 0)."""

    def index(key: str) -> int:
        suffix = key.partition(":")[2]
        return int(suffix) if suffix.isdigit() else 0

    def pick(role: str) -> tuple[ModuleRef, ...]:
        keys = sorted((k for k in special if role_of(k) == role), key=index)
        return tuple(special[k] for k in keys)

    return pick("router"), pick("experts")


class Ownership(str, Enum):
    """Who holds a parameter's optimizer state."""

    REPLICATED = "replicated"
    """Every replica peer holds the same full state (DDP, ZeRO-0): optimizer replay applies."""
    SHARDED = "sharded"
    """Each shard replicated on replica peers (HSDP, ZeRO-1/2 with replicas), which compare it."""
    UNIQUE = "unique"
    """One owner per shard (pure FSDP, ZeRO-3 without replicas): buddy replay checks it."""


@dataclass(frozen=True)
class ModuleRef:
    """A module and its dotted path inside the model, as evidence records name it. A wrapped
    block (activation checkpointing, ``torch.compile``, FSDP) has two handles: ``module``, the
    block replay materialises and calls, and ``outer`` (None when the same), the wrapper the
    model calls, where capture hooks go: it runs once per forward, a checkpointed block twice."""

    path: str
    module: torch.nn.Module
    outer: torch.nn.Module | None = None
    capture_copy: Callable[[torch.Tensor], torch.Tensor] | None = None
    """How a capture keeps a tensor it records: a plain, full, detached copy (sharded DTensors
    are gathered on SCOUT's own groups); None: ``tensor.detach().clone()``."""

    @property
    def hooked(self) -> torch.nn.Module:
        """Where capture hooks go: :attr:`outer` if set, else :attr:`module`."""
        return self.module if self.outer is None else self.outer


@dataclass(frozen=True)
class RngStream:
    """One random stream replay must reproduce and then restore; ``get`` returns the state as
    a CPU ``uint8`` tensor (broadcast as bytes), ``set`` installs it."""

    name: str
    get: Callable[[], torch.Tensor]
    set: Callable[[torch.Tensor], None]


@runtime_checkable
class FrameworkAdapter(Protocol):
    """What a plugin supplies to the core. All methods are cheap and side-effect free."""

    name: str
    """Short framework name, e.g. ``"torch"``, ``"deepspeed"``."""

    def layout(self) -> MeshLayout:
        """The job's parallel layout."""
        ...

    def rank(self) -> int:
        """This process's global rank."""
        ...

    def address(self) -> MeshAddress:
        """This rank's mesh address ``(d, s, t, p, c, e)``."""
        ...

    def training_groups(self) -> Mapping[str, ProcessGroup]:
        """The framework's own process groups by axis or role name (never used for traffic)."""
        ...

    def repeated_layers(self) -> Sequence[ModuleRef]:
        """The repeated blocks replay rotates through, in model order."""
        ...

    def special_modules(self) -> Mapping[str, ModuleRef]:
        """``"embedding"``, ``"lm_head"`` and, per MoE layer ``i``, ``"router:<i>"`` and
        ``"experts:<i>"`` (a ``ModuleList`` of ``(rows, d_model)`` → ``(rows, d_model)``)."""
        ...

    def optimizers(self) -> Sequence[torch.optim.Optimizer]:
        """The underlying ``torch.optim.Optimizer`` objects (unwrapped from framework wrappers)."""
        ...

    def optimizer_ownership(self) -> Ownership:
        """Whether optimizer state is replicated, sharded-with-replicas or uniquely owned."""
        ...

    def rng_streams(self) -> Sequence[RngStream]:
        """Every RNG stream replay must set from the source peer and restore afterwards."""
        ...

    def steps_per_iteration(self) -> Sequence[int]:
        """How many times each optimizer of :meth:`optimizers` steps per training iteration
        (1 almost everywhere; DeepSpeed's ZeRO steps its inner optimizer once per group)."""
        ...

    def materialize(self, ref: ModuleRef) -> AbstractContextManager[Mapping[str, torch.Tensor]]:
        """Context yielding full copies of ``ref.module``'s parameters by name; sharded
        frameworks gather only this module, off the training path where they can (timed)."""
        ...

    def local_shards(self, ref: ModuleRef) -> Sequence[torch.Tensor]:
        """This rank's local parameter shards of ``ref``, in name order: comparing them across
        replica peers localises corruption before a gather spreads it."""
        ...

    def call(
        self,
        module: torch.nn.Module,
        state: Mapping[str, torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``module`` functionally on ``state`` (full parameters), bypassing framework
        hooks that would talk on the training communicator or touch live ``.grad``."""
        ...

    def bind_groups(self, groups: Mapping[str, PeerGroup]) -> None:
        """Receive SCOUT's diagnostic peer groups (``"peer"``, and ``"shard"`` under HSDP)."""
        ...

    def close(self) -> None:
        """Remove whatever the adapter attached (idempotent)."""
        ...
