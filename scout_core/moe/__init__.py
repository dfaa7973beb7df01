"""MoE shape coverage (paper §6.2): the offline catalog of expert shapes to replay.

Expert GEMMs change shape with routing, and a fault may show at one shape and not
another; replaying every admitted shape online is too slow. This package builds,
offline, the fewest representative shapes whose execution paths cover every
admitted shape, binds them to the environment they were found in, and gives the
online replay a rotation through them.

* :mod:`~scout_core.moe.coverage`: ``a >= b`` and the minimum cover (pure).
* :mod:`~scout_core.moe.shapes`: expert shapes and the expert class of one catalog.
* :mod:`~scout_core.moe.routing`: heterogeneous models: layers → expert classes.
* :mod:`~scout_core.moe.profiler`: the profiler Protocol; :mod:`~scout_core.moe.tiles`
  (analytic tile model, CPU) and :mod:`~scout_core.moe.gpu` (cuBLAS / Triton on a GPU).
* :mod:`~scout_core.moe.environment`: device, software stack, model, profiler; drift.
* :mod:`~scout_core.moe.catalog` and :mod:`~scout_core.moe.catalog_set`: discovery,
  JSON files, rotation, load-or-rediscover.

Online, the ``experts`` recipe (:mod:`scout_core.replay.experts`) replays each MoE
layer's experts at these representatives, rotating through the catalog named by
``Config.moe_catalog``. The layers' dispatch and combine are replayed by the
``all_to_all`` recipe (:mod:`scout_core.replay.all_to_all`), which needs no catalog.
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
