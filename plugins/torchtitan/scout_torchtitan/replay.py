"""What replay must undo on a TorchTitan block so it runs locally under tensor parallelism.

Contract: :func:`detach_titan_parallelism` strips from a replay twin the ``forward`` closures
TorchTitan's ``Module.parallelize`` installs and clears its ``tp_group``, so the twin computes the
plain function of its full tensors off the training TP group. docs/torchtitan.md, "Replay under TP".
"""

from __future__ import annotations

from torch import nn

__all__ = ["detach_titan_parallelism", "is_titan_parallel_forward", "parallel_forwards"]

_WRAPPER = "forward_with_redistribution"
_HOME = "torchtitan.protocols.module"


def is_titan_parallel_forward(fn: object) -> bool:
    """Whether ``fn`` is the forward wrapper TorchTitan's ``Module.parallelize`` installs."""
    return getattr(fn, "__module__", "") == _HOME and _WRAPPER in getattr(fn, "__qualname__", "")


def parallel_forwards(module: nn.Module) -> list[str]:
    """Paths (``""`` for ``module`` itself) whose instance ``forward`` is TorchTitan's wrapper."""
    return [
        path
        for path, sub in module.named_modules()
        if is_titan_parallel_forward(sub.__dict__.get("forward"))
    ]


def detach_titan_parallelism(twin: nn.Module) -> nn.Module:
    """Strip TorchTitan's TP wrappers and ``tp_group`` from ``twin`` in place; return it. ``twin``
    has its own ``__dict__`` per submodule (the core's ``hook_free_twin``): never the live model."""
    for sub in twin.modules():
        if is_titan_parallel_forward(sub.__dict__.get("forward")):
            del sub.__dict__["forward"]
        if sub.__dict__.get("tp_group") is not None:
            sub.__dict__["tp_group"] = None
    return twin
