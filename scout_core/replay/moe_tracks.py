"""Which MoE recipes a job gets: the ``router``, ``experts`` and ``all_to_all`` tracks.

Contract: :func:`moe_recipes` turns the adapter's MoE modules (``special_modules()`` roles
``router:<i>`` and ``experts:<i>``) into up to three added schedule tracks, in this order:
``router`` (each router, replayed like a layer), ``experts`` (one target per MoE layer and
representative of the ``Config.moe_catalog`` catalog; none, with a warning, without one) and
``all_to_all`` (only under expert parallelism, on SCOUT's EP groups). Under expert parallelism
the blocks that hold an MoE layer leave the hidden-layer rotation, since replaying one would
send its dispatch on the training EP group, unless the adapter sets ``replays_ep_blocks``. A
catalog that cannot be read, or was discovered for another device or software stack, raises
:class:`~scout_core.errors.ConfigError` on every rank (each reads the same file). docs/moe.md,
"Replay of routers and experts" and "Replay of the all-to-all".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_core.config import Config
from scout_core.errors import CatalogError, ConfigError
from scout_core.integration.adapter import ModuleRef, moe_modules
from scout_core.moe.catalog_set import CatalogSet
from scout_core.moe.environment import current_environment
from scout_core.replay.all_to_all import AllToAllTarget, all_to_all_targets
from scout_core.replay.experts import ExpertTarget, expert_targets
from scout_core.replay.schedule import ALL_TO_ALL, EXPERTS, HIDDEN, ROUTER, Track
from scout_core.topology.mesh import Axis, MeshLayout

__all__ = ["MoERecipes", "moe_recipes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoERecipes:
    """The MoE part of a job's schedule (:func:`moe_recipes`)."""

    layers: list[ModuleRef]
    """The hidden layers left for the hidden-layer rotation."""
    routers: tuple[ModuleRef, ...]
    """The routers, replayed like layers (empty when ``router`` is off)."""
    experts: dict[str, ExpertTarget]
    all_to_all: dict[str, AllToAllTarget]
    """The ``all_to_all`` track's targets (empty without expert parallelism)."""
    tracks: list[Track]


def moe_recipes(
    layers: Sequence[ModuleRef],
    special: Mapping[str, ModuleRef],
    layout: MeshLayout,
    config: Config,
    *,
    keep_ep_blocks: bool = False,
) -> MoERecipes:
    """The MoE part of the schedule: the hidden layers left (all, with ``keep_ep_blocks``),
    the routers replayed like layers, the expert and all-to-all targets, the added tracks."""
    routers, experts = moe_modules(special)
    ep = layout.size(Axis.E) > 1
    layers = _without_ep_blocks(layers, experts, ep and not keep_ep_blocks, config)
    tracks: list[Track] = []
    a2a = all_to_all_targets(routers, experts) if ep and ALL_TO_ALL in config.recipes else {}
    if ROUTER not in config.recipes:
        routers = ()
    if routers:
        tracks.append(Track(ROUTER, config.router_interval, tuple(r.path for r in routers)))
    targets = _expert_targets(experts, config) if EXPERTS in config.recipes else {}
    if targets:
        tracks.append(Track(EXPERTS, config.expert_interval, tuple(targets)))
    if a2a:
        tracks.append(Track(ALL_TO_ALL, config.all_to_all_interval, tuple(a2a)))
    return MoERecipes(layers, routers, targets, a2a, tracks)


def _without_ep_blocks(
    layers: Sequence[ModuleRef], experts: Sequence[ModuleRef], ep: bool, config: Config
) -> list[ModuleRef]:
    """``layers`` without the blocks that hold an MoE layer's experts under expert
    parallelism (module doc); logged once when any block is left out."""
    if not (ep and experts and HIDDEN in config.recipes):
        return list(layers)
    inside = {id(e.module) for e in experts}
    kept = [r for r in layers if not any(id(m) in inside for m in r.module.modules())]
    if len(kept) < len(layers):
        log.warning(
            "hidden-layer replay leaves out %d block(s) holding expert-parallel MoE "
            "layers (their all-to-all runs on the training EP group); their routers, "
            "experts and all-to-alls are replayed by the 'router', 'experts' and "
            "'all_to_all' recipes",
            len(layers) - len(kept),
        )
    return kept


def _expert_targets(experts: Sequence[ModuleRef], config: Config) -> dict[str, ExpertTarget]:
    """The ``experts`` track's targets from ``config.moe_catalog`` (module doc)."""
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
    drift = stack_drift(catalogs, _device_of(experts))
    if drift:
        raise ConfigError(
            f"key 'moe_catalog': {config.moe_catalog!r} was discovered for another "
            f"environment: {'; '.join(drift)}. Its representatives may not cover this job's "
            "kernels: rediscover it here (`scout catalog discover`) and point moe_catalog at "
            "the new file"
        )
    return expert_targets(experts, catalogs)


def stack_drift(catalogs: CatalogSet, device: str) -> list[str]:
    """What of each catalog's device and software stack (device name, torch, CUDA, Triton)
    differs from this job's, one line per class and field (empty: none). The model and
    profiler parts are checked where they are at hand (``CatalogSet.check``,
    ``scout catalog``); online, replay checks what decides kernel selection that the job knows."""
    lines: list[str] = []
    for name, catalog in catalogs.catalogs.items():
        env = catalog.environment
        now = current_environment(env.model, env.profiler, device=device)
        lines.extend(f"class {name!r}: {d}" for d in env.drift(now))
    return lines


def _device_of(experts: Sequence[ModuleRef]) -> str:
    """The name of the device the experts live on (``cpu``, or the CUDA device's name)."""
    import torch

    for ref in experts:
        for p in ref.module.parameters():
            if p.device.type == "cuda":
                return str(torch.cuda.get_device_name(p.device))
            return "cpu"
    return "cpu"
