"""Instance-level ``forward`` overrides: replayed where that is safe, inconclusive where not.

Contract: :func:`instance_forwards` finds the submodules whose ``forward`` a user replaced on
the instance (a framework's own, by :data:`FRAMEWORK_PREFIXES`, are the plugin's to undo
and not counted), and :func:`live_call_hazard` says why calling the live module from replay
could reach a training collective (a parallel axis, a sharded parameter, a framework hook),
or ``None``. :class:`InstanceForwards` keeps that answer per layer, logs it once, and tells
the runner how to call each layer: the adapter's ``call`` without an override, the live
module with the replay parameters bound where that is safe, else ``None`` (the round reads
inconclusive, :attr:`.gaps.Gap.TRAINING_COLLECTIVE`): replay never enters a training
collective. Why the live module: docs/replay.md, "One round, step by step" (step 5).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torch import nn

from scout_core.topology.mesh import Axis, MeshLayout

__all__ = ["FRAMEWORK_PREFIXES", "InstanceForwards", "instance_forwards", "live_call_hazard"]

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Callable[..., Any])

FRAMEWORK_PREFIXES = (
    "torch.",
    "deepspeed.",
    "megatron.",
    "torchtitan.",
    "transformer_engine.",
    "apex.",
)
"""Modules whose instance ``forward`` closures and hooks are a framework's own."""

_PARALLEL_AXES = {
    Axis.T: "tensor parallelism",
    Axis.C: "sequence/context parallelism",
    Axis.E: "expert parallelism",
    Axis.S: "sharded parameters (FSDP / ZeRO-3)",
}


def _origin(fn: object) -> str:
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        return str(type(owner).__module__)
    inner = getattr(fn, "func", None)  # functools.partial
    return str(getattr(inner if inner is not None else fn, "__module__", "") or "")


def _framework(fn: object) -> bool:
    return _origin(fn).startswith(FRAMEWORK_PREFIXES)


def instance_forwards(module: nn.Module) -> list[str]:
    """Paths (``""`` for ``module`` itself) whose instance ``forward`` a user installed."""
    return [
        path
        for path, sub in module.named_modules()
        if "forward" in sub.__dict__ and not _framework(sub.__dict__["forward"])
    ]


def live_call_hazard(module: nn.Module, layout: MeshLayout) -> str | None:
    """Why calling ``module`` itself from replay could reach a training collective, or
    ``None`` when it cannot (data parallel only: DDP, ZeRO-1/2, pipeline stages)."""
    for axis, what in _PARALLEL_AXES.items():
        if layout.size(axis) > 1:
            return f"{what} ({axis.value}={layout.size(axis)}) may talk on a training group"
    for name, p in module.named_parameters():
        if hasattr(p, "device_mesh") or hasattr(p, "_st_info") or hasattr(p, "ds_id"):
            return f"parameter {name!r} is sharded"
    for path, sub in module.named_modules():
        hooks = list(sub._forward_pre_hooks.values()) + list(sub._forward_hooks.values())
        if any(_framework(h) for h in hooks):
            return f"a framework hook on {path or 'the module'}"
    return None


class InstanceForwards:
    """The layers with a user's instance-level ``forward`` seen so far and each one's hazard
    (``None``: replayed on the live module), said once in the log."""

    def __init__(self, layout: MeshLayout) -> None:
        self.layout = layout
        self.seen: dict[str, str | None] = {}

    def announce(self, modules: Mapping[str, Any]) -> dict[str, str | None]:
        """Find the layers of ``modules`` (path to a ref) with an instance-level ``forward``
        and log once, one line each way, which are replayed and which read inconclusive."""
        safe: list[tuple[str, str | None]] = []
        unsafe: list[tuple[str, str | None]] = []
        for path, ref in modules.items():
            if path in self.seen or not instance_forwards(ref.module):
                continue
            hazard = self.seen[path] = live_call_hazard(ref.module, self.layout)
            (safe if hazard is None else unsafe).append((path, hazard))
        if safe:
            log.warning(
                "%s have an instance-level forward; replay runs it on the live module "
                "with the replay parameters bound",
                ", ".join(p for p, _ in safe),
            )
        if unsafe:
            log.warning(
                "%s have an instance-level forward that replay cannot run without "
                "possibly reaching a training collective (%s); their rounds read inconclusive",
                ", ".join(p for p, _ in unsafe),
                unsafe[0][1],
            )
        return dict(self.seen)

    def call_for(self, path: str, module: nn.Module, *, call: C, live: C) -> C | None:
        """How to run the layer at ``path``: ``call`` (the adapter's), ``live`` where a user
        replaced its ``forward`` on the instance and that is safe, else ``None``."""
        found = instance_forwards(module)
        if not found:
            return call
        if path not in self.seen:
            hazard = live_call_hazard(module, self.layout)
            self.seen[path] = hazard
            where = ", ".join(f"{path}.{p}" if p else path for p in found)
            if hazard is None:
                log.warning(
                    "%s has an instance-level forward (%s); replay runs it on the live "
                    "module with the replay parameters bound",
                    path,
                    where,
                )
            else:
                log.warning(
                    "%s has an instance-level forward (%s) and %s: replaying it could "
                    "reach a training collective, so its rounds read inconclusive",
                    path,
                    where,
                    hazard,
                )
        return live if self.seen[path] is None else None
