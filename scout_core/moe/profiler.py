"""The one small seam every shape profiler implements.

Discovery asks a profiler for each admitted shape's :class:`~scout_core.moe.coverage.Profile`;
nothing else about a profiler matters to the catalog. Two ship with SCOUT: the analytic
:class:`~scout_core.moe.tiles.TileModel` (any host) and :mod:`scout_core.moe.gpu`.
:meth:`ShapeProfiler.describe` is part of the catalog's environment binding: a catalog
discovered by another profiler, or with other settings, is stale.
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
