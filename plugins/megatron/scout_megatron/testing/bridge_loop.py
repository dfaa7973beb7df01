"""A training loop that fires Megatron-Bridge 0.3.1's callback events the way ``train()`` does.

Bridge's ``pretrain`` needs CUDA (Megatron's DDP, schedules and optimizer setup), so
on CPU this loop stands in for ``megatron.bridge.training.train.train``. It keeps the
parts a callback can observe: one ``CallbackContext`` per event (Bridge's real
dataclass, from :func:`scout_megatron.bridge.bridge_callbacks`), a ``state`` whose
``train_state.step`` counts completed iterations and is incremented *after*
``on_train_step_end``, ``loss_dict`` / ``grad_norm`` / ``skipped_iter`` in
``on_train_step_end``, and events fired only when a callback is registered for them
(``should_fire``). The training step is :func:`scout_megatron.testing.gpt.train_step`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from scout_megatron.bridge import bridge_callbacks
from scout_megatron.testing.gpt import TinyGPT, get_batch, train_step

__all__ = ["run_bridge_loop"]


def run_bridge_loop(
    callbacks: Any,
    chunks: Sequence[nn.Module],
    optimizer: Any,
    spec: TinyGPT,
    steps: int,
    *,
    start_step: int = 0,
) -> Any:
    """Train ``steps`` iterations firing Bridge's events; returns the Bridge-shaped state.

    ``callbacks`` is what ``pretrain`` takes: a list of ``Callback`` s or a
    ``CallbackManager``.
    """
    api = bridge_callbacks()
    manager = api.normalize_callbacks(callbacks)
    state = SimpleNamespace(train_state=SimpleNamespace(step=start_step))
    model = list(chunks)

    def fire(event: str, **extra: Any) -> None:
        if api.should_fire(manager, event):
            context = api.CallbackContext(
                state=state,
                model=model,
                user_state=manager.user_state,
                optimizer=optimizer,
                scheduler=None,
                **extra,
            )
            manager.fire(event, context)

    fire("on_train_start")
    while state.train_state.step < start_step + steps:
        fire("on_train_step_start")
        loss = train_step(model[0], optimizer, get_batch(spec, state.train_state.step))
        fire(
            "on_train_step_end",
            loss_dict={"lm loss": torch.tensor(loss)},
            grad_norm=None,
            skipped_iter=False,
        )
        state.train_state.step += 1
    fire("on_train_end")
    return state
