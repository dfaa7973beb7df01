"""The conditions a replay runs under, and how its intervals are timed on any device.

Contract: healthy peers compute bitwise-equal results from equal inputs and a slow device shows
in the timings, while training never sees the conditions. :func:`deterministic_scope` turns
deterministic algorithms on and pins the intra-op thread count, restoring both on exit; on
CUDA without ``CUBLAS_WORKSPACE_CONFIG`` (:data:`CUBLAS_WORKSPACES`) it raises
:class:`~scout_core.errors.ConfigError` before anything runs. :func:`check_cublas_workspace`,
run once at ``enable``, sets the variable while CUDA has not started, else returns the refusal.
:func:`rng_scope` restores every RNG stream it saved. :class:`Interval` times work until the
device has finished it (CUDA events after a device synchronisation; the monotonic clock on the
CPU). docs/replay.md, "On CUDA".
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from scout_core.errors import ConfigError
from scout_core.integration.adapter import RngStream

__all__ = [
    "CUBLAS_WORKSPACES",
    "Interval",
    "check_cublas_workspace",
    "deterministic_scope",
    "device_of",
    "rng_scope",
]

CUBLAS_WORKSPACES = (":4096:8", ":16:8")
"""The ``CUBLAS_WORKSPACE_CONFIG`` values that make cuBLAS deterministic."""

_CUBLAS_HELP = (
    "deterministic replay on CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) in the "
    "environment before CUDA starts; set it in the launch environment (e.g. "
    "`CUBLAS_WORKSPACE_CONFIG=:4096:8 torchrun ...`) or turn replay's determinism off "
    "with Config(deterministic=False)"
)


def _cuda_started() -> bool:
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]  # unannotated in torch


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and _cuda_started()


def check_cublas_workspace(*, uses_cuda: bool, deterministic: bool) -> str | None:
    """Make deterministic cuBLAS possible for replay: ``None`` when nothing is needed or all
    is well (setting the variable itself while CUDA is not initialised), else the refusal's
    message (the caller agrees on it job-wide and raises :class:`ConfigError`)."""
    if not (uses_cuda and deterministic):
        return None
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") in CUBLAS_WORKSPACES:
        return None
    if not _cuda_started():
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACES[0]
        return None
    return (
        f"CUBLAS_WORKSPACE_CONFIG is {os.environ.get('CUBLAS_WORKSPACE_CONFIG')!r} and CUDA "
        f"is already initialised: {_CUBLAS_HELP}"
    )


@contextmanager
def deterministic_scope(enabled: bool, threads: int, *, cuda: bool = False) -> Iterator[None]:
    """Deterministic algorithms and a pinned intra-op thread count, restored on exit; with
    ``cuda`` and ``enabled``, a missing ``CUBLAS_WORKSPACE_CONFIG`` raises first (module doc)."""
    if enabled and cuda and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_WORKSPACES:
        raise ConfigError(_CUBLAS_HELP)
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    try:
        if enabled and not prev_det:
            torch.use_deterministic_algorithms(True)
        if threads != prev_threads:
            torch.set_num_threads(threads)
        yield
    finally:
        if enabled and not prev_det:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        if torch.get_num_threads() != prev_threads:
            torch.set_num_threads(prev_threads)


@contextmanager
def rng_scope(streams: Sequence[RngStream]) -> Iterator[None]:
    """Save every stream's state and put it back on exit."""
    saved = [(s, s.get()) for s in streams]
    try:
        yield
    finally:
        for s, state in saved:
            s.set(state)


def device_of(items: Iterable[Any]) -> torch.device:
    """The first CUDA device among ``items``' tensors, else the CPU."""
    for x in items:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return x.device
    return torch.device("cpu")


class Interval:
    """Accumulated seconds of work that ends when ``device`` has finished it."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda" and _cuda_in_use()
        self.seconds = 0.0
        self._t0 = 0.0
        self._start: Any = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch.cuda.Event is unannotated
            self._start.record()
        else:
            self._t0 = time.monotonic()

    def stop(self) -> float:
        """End the interval (waiting for the device); returns the total so far."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch.cuda.Event is unannotated
            end.record()
            end.synchronize()
            self.seconds += float(self._start.elapsed_time(end)) / 1000.0
        else:
            self.seconds += time.monotonic() - self._t0
        return self.seconds

    @contextmanager
    def timing(self) -> Iterator[Interval]:
        """``with interval.timing():`` adds the block's time (on exit, even on error)."""
        self.start()
        try:
            yield self
        finally:
            self.stop()
