"""The one seam replay offers for fault simulation: capture vetoes and comm delays.

Two faults cannot be injected through public PyTorch hooks: a rank that misses a replay capture,
and a slow link as SCOUT's own timed communication sees it (its diagnostic collectives run on
groups no user code touches). Injectors register here; replay consults these lists at exactly two
points. Nothing registers in production: one empty-list check per capture and per timed collective.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = [
    "add_capture_veto",
    "add_comm_delay",
    "capture_vetoed",
    "comm_delay_s",
    "injected_delay",
    "sleep_injected",
]

_vetoes: list[Callable[[str], bool]] = []
_delays: list[Callable[[str], float]] = []


def add_capture_veto(fn: Callable[[str], bool]) -> Callable[[], None]:
    """``fn(module_path)`` returning True makes this rank skip that capture; returns a remover."""
    _vetoes.append(fn)
    return lambda: _vetoes.remove(fn) if fn in _vetoes else None


def add_comm_delay(fn: Callable[[str], float]) -> Callable[[], None]:
    """``fn(group_kind)`` returns seconds to stall inside a timed collective; returns a remover."""
    _delays.append(fn)
    return lambda: _delays.remove(fn) if fn in _delays else None


def capture_vetoed(path: str) -> bool:
    """Whether an injector asks this rank to skip capturing ``path``."""
    return any(fn(path) for fn in list(_vetoes)) if _vetoes else False


def injected_delay(kind: str) -> float:
    """Seconds injectors ask this rank to stall inside a timed collective on a ``kind`` group."""
    return sum(fn(kind) for fn in list(_delays)) if _delays else 0.0


comm_delay_s = injected_delay
"""The older name of :func:`injected_delay`."""


def sleep_injected(kind: str) -> None:
    """Stall for :func:`injected_delay` ``(kind)`` seconds, if any: call it right before
    entering the timed collective, where a slow link at this rank would stall it."""
    if _delays:
        delay = injected_delay(kind)
        if delay:
            time.sleep(delay)
