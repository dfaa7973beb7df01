"""MoE shape coverage (paper §6.2): the offline catalog of expert shapes to replay.

Expert GEMMs change shape with routing, and replaying every admitted shape online is too
slow. This package builds, offline, the fewest representative shapes whose execution paths
cover every admitted shape, binds them to their environment, and gives online replay a
rotation through them. Docs: docs/moe.md.
"""

from __future__ import annotations

from scout_core.moe.catalog import Catalog, discover
from scout_core.moe.catalog_set import CatalogSet, load_or_discover
from scout_core.moe.coverage import Cover, Profile, covers, minimum_cover
from scout_core.moe.environment import Environment, current_environment
from scout_core.moe.profiler import ShapeProfiler
from scout_core.moe.routing import ExpertLayerSpec, class_for, expert_classes
from scout_core.moe.shapes import ExpertClass, ExpertShape
from scout_core.moe.tiles import DEFAULT_RULES, TileConfig, TileModel, TileRule

__all__ = [
    "Catalog",
    "CatalogSet",
    "Cover",
    "DEFAULT_RULES",
    "Environment",
    "ExpertClass",
    "ExpertLayerSpec",
    "ExpertShape",
    "Profile",
    "ShapeProfiler",
    "TileConfig",
    "TileModel",
    "TileRule",
    "class_for",
    "covers",
    "current_environment",
    "discover",
    "expert_classes",
    "load_or_discover",
    "minimum_cover",
]
