"""One replay boundary per DeepSpeed optimizer step, however many inner steps ZeRO takes.

SCOUT's step hooks sit on the ``torch.optim.Optimizer`` inside DeepSpeed's ZeRO
wrapper. The wrapper steps that optimizer once per parameter group (ZeRO 1/2:
``_optimizer_step(i)`` for each of ``bit16_groups``) or per sub-group (ZeRO-3: each
of ``fp16_groups``), with ``param_groups`` narrowed to that group. A model with
several groups (an MoE model's dense and expert groups, weight-decay groups, a
ZeRO-3 model above ``sub_group_size``) would therefore fire every step hook several
times per training step: several replay boundaries, the later ones with no capture.

:class:`StepCoalescer` makes them fire once: it shadows the wrapper's
``_optimizer_step`` on the *instance* (the class is untouched) so that the first
group's step runs as is, hooks and all, and every later group's step runs with the
inner optimizer's hooks hidden. The first group's step is the only point where
*every* module parameter is still the one this iteration's forward used: right
after ``_optimizer_step(i)`` DeepSpeed copies group ``i``'s updated fp32 partition
into the module's storage (ZeRO 1/2) or reassigns its partition (ZeRO-3), so a
boundary after the last group would see this rank's own partitions updated and the
peers' stale, and replicas would disagree. With one group nothing is installed and
the hooks fire exactly where they did. The hooks see ``param_groups`` narrowed to
the first group; SCOUT's hooks do not read them under ZeRO (optimizer state is
uniquely owned, so optimizer replay is off). :meth:`StepCoalescer.remove` restores
the wrapper.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

__all__ = ["StepCoalescer", "inner_steps_per_step"]


def inner_steps_per_step(wrapper: Any) -> int:
    """How many times ``wrapper.step`` steps the inner optimizer (0: not a ZeRO wrapper)."""
    if not callable(getattr(wrapper, "_optimizer_step", None)):
        return 0
    for name in ("bit16_groups", "fp16_groups"):  # ZeRO 1/2, then ZeRO-3
        groups = getattr(wrapper, name, None)
        if isinstance(groups, list) and groups:
            return len(groups)
    return 0


class StepCoalescer:
    """Fires ``inner``'s step hooks once per ``wrapper.step``: with the first group's step."""

    def __init__(self, wrapper: Any, inner: torch.optim.Optimizer) -> None:
        self.wrapper = wrapper
        self.inner = inner
        self.groups = inner_steps_per_step(wrapper) if wrapper is not inner else 0
        self.installed = self.groups > 1
        if self.installed:
            self._original = wrapper._optimizer_step
            wrapper._optimizer_step = self._step_group

    def _step_group(self, index: int, *args: Any, **kwargs: Any) -> Any:
        if index == 0:
            return self._original(index, *args, **kwargs)
        inner = self.inner
        pre, post = inner._optimizer_step_pre_hooks, inner._optimizer_step_post_hooks
        inner._optimizer_step_pre_hooks = OrderedDict()
        inner._optimizer_step_post_hooks = OrderedDict()
        try:
            return self._original(index, *args, **kwargs)
        finally:
            inner._optimizer_step_pre_hooks = pre
            inner._optimizer_step_post_hooks = post

    def remove(self) -> None:
        """Give the wrapper its own ``_optimizer_step`` back (idempotent)."""
        if self.installed and self.wrapper.__dict__.get("_optimizer_step") == self._step_group:
            del self.wrapper._optimizer_step
        self.installed = False
