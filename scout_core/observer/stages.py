"""Stage publishing: the DataLoader fetch, checkpoint I/O, repeated layers, the optimizer.

The observer can name *what* a lagging rank was doing only if the trainer said so first
(a rank stuck in the DataLoader fetch is an ``input_stall``, in a checkpoint write a
``checkpoint_stall``); these helpers publish each stage's entry and exit. Layer and
optimizer hooks also keep a lagging rank visible where collectives are issued from C++
(DDP's reducer, FSDP2), which the Python-level patch of :mod:`.fingerprint` never sees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from torch import nn
from torch.optim import Optimizer

from scout_core.observer.progress import Publisher, Stage

__all__ = ["WatchedLoader", "attach_progress_hooks", "checkpoint_stage", "watch_dataloader"]

T = TypeVar("T")


class _WatchedIterator(Generic[T]):
    def __init__(self, it: Iterator[T], publisher: Publisher) -> None:
        self._it = it
        self._publisher = publisher

    def __iter__(self) -> _WatchedIterator[T]:
        return self

    def __next__(self) -> T:
        self._publisher.publish(Stage.DATALOADER)
        try:
            return next(self._it)
        finally:
            self._publisher.leave()


class WatchedLoader(Generic[T]):
    """An iterable (a DataLoader) whose every fetch is published as ``DATALOADER``.

    Re-iterable when the wrapped object is; ``len`` and attributes (``.sampler``) pass
    through, so it can replace a DataLoader in a training loop."""

    def __init__(self, loader: Iterable[T], publisher: Publisher) -> None:
        self.loader = loader
        self._publisher = publisher

    def __iter__(self) -> Iterator[T]:
        return _WatchedIterator(iter(self.loader), self._publisher)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # only when the loader is sized

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def watch_dataloader(loader: Iterable[T], publisher: Publisher) -> WatchedLoader[T]:
    """Wrap ``loader`` so that each ``next()`` publishes DataLoader entry and exit."""
    return WatchedLoader(loader, publisher)


@contextlib.contextmanager
def checkpoint_stage(publisher: Publisher, kind: str = "write") -> Iterator[None]:
    """Publish a checkpoint ``write`` or ``read`` for the duration of the block."""
    stages = {"write": Stage.CHECKPOINT_WRITE, "read": Stage.CHECKPOINT_READ}
    if kind not in stages:
        raise ValueError(f"checkpoint stage kind must be 'write' or 'read', got {kind!r}")
    publisher.publish(stages[kind])
    try:
        yield
    finally:
        publisher.leave()


def attach_progress_hooks(
    publisher: Publisher,
    layers: Sequence[nn.Module],
    optimizers: Sequence[Optimizer],
    *,
    advance_step: bool = True,
) -> Callable[[], None]:
    """Publish at every repeated layer's forward and around every optimizer step.

    With ``advance_step`` each optimizer's post-step hook advances the published step (a bare
    observer; a session uses its replay boundaries, so several optimizers count one step).
    Returns an idempotent closer that removes every hook."""
    handles: list[Any] = []

    def layer_pre(_module: nn.Module, _args: Any) -> None:
        publisher.publish(Stage.LAYER)

    def opt_pre(_opt: Optimizer, _args: Any, _kwargs: Any) -> None:
        publisher.publish(Stage.OPTIMIZER)

    def opt_post(_opt: Optimizer, _args: Any, _kwargs: Any) -> None:
        publisher.advance_step()

    for layer in layers:
        handles.append(layer.register_forward_pre_hook(layer_pre))
    for opt in optimizers:
        handles.append(opt.register_step_pre_hook(opt_pre))
        if advance_step:
            handles.append(opt.register_step_post_hook(opt_post))

    def close() -> None:
        while handles:
            handles.pop().remove()

    return close
