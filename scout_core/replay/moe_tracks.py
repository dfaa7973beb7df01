"""Which MoE recipes a job gets: the ``router`` and ``experts`` tracks of its schedule.

The driver asks the adapter for its MoE modules (``special_modules()`` roles
``router:<i>`` and ``experts:<i>``, :func:`~scout_core.integration.adapter.moe_modules`)
and turns them into two added schedule tracks:

* ``router``: each MoE layer's router, captured and replayed like a layer (its input
  has a fixed shape, so the dense rules apply);
* ``experts``: one target per MoE layer and representative of the shape catalog named
  by ``Config.moe_catalog`` (:func:`~scout_core.replay.experts.expert_targets`).

Under expert parallelism the blocks that hold an MoE layer leave the hidden-layer
rotation: replaying such a block would run its dispatch all-to-all, which the model
sends on its own training EP group, and SCOUT never talks on a training group. An
adapter that re-points that all-to-all to SCOUT's own groups during a replayed call
says so with ``replays_ep_blocks = True`` (DeepSpeed's does), and its blocks stay.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from scout_core.config import Config
from scout_core.errors import CatalogError, ConfigError
from scout_core.integration.adapter import ModuleRef, moe_modules
from scout_core.moe.catalog_set import CatalogSet
from scout_core.replay.experts import ExpertTarget, expert_targets
from scout_core.replay.schedule import EXPERTS, HIDDEN, ROUTER, Track
from scout_core.topology.mesh import Axis, MeshLayout

__all__ = ["moe_recipes"]

log = logging.getLogger(__name__)


def moe_recipes(
    layers: Sequence[ModuleRef],
    special: Mapping[str, ModuleRef],
    layout: MeshLayout,
    config: Config,
    *,
    keep_ep_blocks: bool = False,
) -> tuple[list[ModuleRef], tuple[ModuleRef, ...], dict[str, ExpertTarget], list[Track]]:
    """The MoE part of the schedule: the hidden layers left (:func:`_without_ep_blocks`,
    unless the adapter replays such blocks safely: ``keep_ep_blocks``), the routers
    replayed like layers, the expert targets and the two added tracks."""
    routers, experts = moe_modules(special)
    ep = layout.size(Axis.E) > 1 and not keep_ep_blocks
    layers = _without_ep_blocks(layers, experts, ep, config)
    tracks: list[Track] = []
    if ROUTER not in config.recipes:
        routers = ()
    if routers:
        tracks.append(Track(ROUTER, config.router_interval, tuple(r.path for r in routers)))
    targets = _expert_targets(experts, config) if EXPERTS in config.recipes else {}
    if targets:
        tracks.append(Track(EXPERTS, config.expert_interval, tuple(targets)))
    return layers, routers, targets, tracks


def _without_ep_blocks(
    layers: Sequence[ModuleRef], experts: Sequence[ModuleRef], ep: bool, config: Config
) -> list[ModuleRef]:
    """``layers`` without the blocks that hold an MoE layer's experts under expert
    parallelism: replaying such a block would run its dispatch all-to-all, which the
    model sends on its training EP group. Their experts and routers have their own
    recipes. Logged once when any block is left out."""
    if not (ep and experts and HIDDEN in config.recipes):
        return list(layers)
    inside = {id(e.module) for e in experts}
    kept = [r for r in layers if not any(id(m) in inside for m in r.module.modules())]
    if len(kept) < len(layers):
        log.warning(
            "hidden-layer replay leaves out %d block(s) holding expert-parallel MoE "
            "layers (their all-to-all runs on the training EP group); their routers and "
            "experts are replayed by the 'router' and 'experts' recipes",
            len(layers) - len(kept),
        )
    return kept


def _expert_targets(experts: Sequence[ModuleRef], config: Config) -> dict[str, ExpertTarget]:
    """The ``experts`` track's targets from ``config.moe_catalog``; none (logged) without
    a catalog. A catalog that cannot be read raises :class:`ConfigError` on every rank
    (each reads the same file)."""
    if not experts:
        return {}
    if config.moe_catalog is None:
        log.warning(
            "the model has %d MoE layer(s) but no 'moe_catalog' is configured, so expert "
            "replay is off; build one with `scout catalog discover` and set moe_catalog",
            len(experts),
        )
        return {}
    try:
        catalogs = CatalogSet.load(config.moe_catalog)
    except (OSError, CatalogError) as exc:
        raise ConfigError(f"key 'moe_catalog': cannot load {config.moe_catalog!r}: {exc}") from exc
    return expert_targets(experts, catalogs)
