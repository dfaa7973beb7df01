"""What replay must undo on a TorchTitan block so it runs locally under tensor parallelism.

TorchTitan 0.3 does not implement TP (nor SP) with ``parallelize_module``'s
forward hooks. ``Module.parallelize`` (``torchtitan/protocols/module.py``) shards
each module's parameters and buffers into DTensors, then *replaces the instance's
``forward``* with a closure, ``forward_with_redistribution``, that redistributes
the inputs, calls the original bound ``forward`` (optionally inside ``local_map``)
and redistributes the outputs, all on the training TP group. The vocab-parallel
``Embedding`` also keeps the training TP group as ``tp_group`` and all-reduces in
its plain ``forward``.

The core's ``hook_free_twin`` copies a module's ``__dict__``, so its twin inherits
those closures: calling the twin would talk on the training TP group and run the
*live* module's bound ``forward`` with the live DTensor parameters, ignoring the
tensors ``functional_call`` binds on the twin. :func:`detach_titan_parallelism`
removes exactly those closures from a twin (the class ``forward`` is then used) and
clears its ``tp_group``, so the twin computes the plain, unsharded function of
whatever full tensors it is given. It never touches the live module: pass it the
twin.
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
    """Strip TorchTitan's TP wrappers and ``tp_group`` from ``twin`` (in place); return it.

    ``twin`` must be a replay twin (its own ``__dict__`` per submodule, as the core's
    ``hook_free_twin`` makes), never the live model.
    """
    for sub in twin.modules():
        if is_titan_parallel_forward(sub.__dict__.get("forward")):
            del sub.__dict__["forward"]
        if sub.__dict__.get("tp_group") is not None:
            sub.__dict__["tp_group"] = None
    return twin
