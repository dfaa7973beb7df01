"""Test tooling shipped with SCOUT, for its own tests, plugin tests and users.

* :func:`run_ranks`: run a function on N local ranks over Gloo with a hard timeout.
* :class:`Faults`: deterministic fault injectors keyed by (rank, step).
* :mod:`scout_core.testing.conformance`: the adapter/plugin conformance checks.

Importing this package does not import torch until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scout_core.testing.harness import RankFailedError, RanksTimeoutError, run_ranks
    from scout_core.testing.injectors import AddNoise, BitFlip, Faults, Scale, flip_bit

__all__ = [
    "run_ranks",
    "RankFailedError",
    "RanksTimeoutError",
    "Faults",
    "BitFlip",
    "Scale",
    "AddNoise",
    "flip_bit",
]

_HOME = {
    "run_ranks": "harness",
    "RankFailedError": "harness",
    "RanksTimeoutError": "harness",
    "Faults": "injectors",
    "BitFlip": "injectors",
    "Scale": "injectors",
    "AddNoise": "injectors",
    "flip_bit": "injectors",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"scout_core.testing.{_HOME[name]}"), name)
    raise AttributeError(f"module 'scout_core.testing' has no attribute {name!r}")
