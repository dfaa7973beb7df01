"""The one small seam every shape profiler implements.

Discovery asks a profiler for each admitted shape's :class:`~scout_core.moe.coverage.Profile`
and hands the profiles to the coverage rule; nothing else about a profiler matters
to the catalog. Two profilers ship with SCOUT:

* :class:`~scout_core.moe.tiles.TileModel`, an analytic tile model of GEMM and
  grouped GEMM that runs anywhere (CPU, CI);
* :mod:`scout_core.moe.gpu`, which runs the expert kernel on a GPU and reads what
  launched (cuBLAS through a kernel trace, or a Triton autotuner's chosen config).

:meth:`ShapeProfiler.describe` is part of the catalog's environment binding: a
catalog discovered by another profiler, or by the same one with other settings,
is stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from scout_core.moe.coverage import Profile
from scout_core.moe.shapes import ExpertShape

__all__ = ["ShapeProfiler"]


@runtime_checkable
class ShapeProfiler(Protocol):
    """Maps an expert shape to its execution fingerprint and path-count vector."""

    @property
    def name(self) -> str:
        """Short profiler name recorded in the catalog, e.g. ``"tile-model"``."""
        ...

    def describe(self) -> Mapping[str, Any]:
        """JSON-able settings that determine the profiles (bound into the catalog)."""
        ...

    def profile(self, shape: ExpertShape) -> Profile:
        """The shape's profile; uncertain (``fingerprint`` or ``counts`` None) when unsure."""
        ...
