"""Instance-level ``forward`` overrides: replayed where that is safe, inconclusive where not.

Users and libraries often replace a module's ``forward`` on the *instance*
(``blk.forward = wrapper(blk.forward)``: accelerate-style hooks, profilers, debug
wrappers). That wrapper is part of what the layer computes in training, so replay
should run it too. Two facts decide how:

* The wrapper usually closes over the *live* module's bound ``forward``. Run on a
  copy of the module (the hook-free twin), it would call the live module with the
  live parameters, ignoring the replay parameters: the replay's parameter
  gradients come back empty and its outputs ignore the source's state. Run on the
  live module with ``torch.func.functional_call``, the replay parameters are bound
  on the very module the wrapper closes over, so the wrapper's cost shows in
  ``t_M`` (a slow wrapper is a straggler) and its arithmetic in the exact
  surfaces (a wrong wrapper is an SDC).
* The live module keeps everything the framework attached to it. Where a layer's
  forward can talk on a training process group (tensor, sequence/context or
  expert parallelism; sharded parameters that FSDP or ZeRO-3 gather; a framework's
  forward hooks), calling it from replay could enter a training collective its
  partners never join, and the job would hang. Replay must never do that: such a
  layer is not replayed while the override is present, and reads *inconclusive*
  with the reason (:data:`scout_core.replay.gaps.Gap.TRAINING_COLLECTIVE`).

Overrides a framework installs itself (TorchTitan's TP ``forward`` closures) are
the plugin's business: its ``call`` undoes them, so they are not counted here.
"""

from __future__ import annotations

from torch import nn

from scout_core.topology.mesh import Axis, MeshLayout

__all__ = ["FRAMEWORK_PREFIXES", "instance_forwards", "live_call_hazard"]

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
