"""Replaying a layer whose forward talks: re-point its process group to SCOUT's own.

Ulysses ``DistributedAttention`` (``spg``) and MoE ``MOELayer`` / ``TopKGate`` (``ep_group``)
run collectives inside their forward. Contract: :class:`Repointer` creates a Gloo group with
the same ordered members for each ``c`` and ``e`` group of the layout (collective, in
``MeshLayout.groups`` order) and checks each such attribute holds this rank's group;
:meth:`Repointer.patched` swaps them to SCOUT's group for one replayed call and restores
them and the MoE per-call state in a ``finally``. Docs: docs/deepspeed.md, "Ulysses
sequence parallel and MoE expert parallel".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch import nn

from scout_core import Axis, MeshLayout
from scout_core.plugin_api import diagnostic_groups, group_ranks, swapped_attributes

__all__ = ["DIAGNOSTIC_TIMEOUT", "Repointer", "Site", "find_sites"]

DIAGNOSTIC_TIMEOUT = timedelta(minutes=5)
"""Partners replay in lockstep, so a long wait means one never arrived: the replay then
fails here (inconclusive) instead of waiting the default 30 minutes."""

_STATE_ATTRS = ("l_aux", "exp_counts")
"""Attributes ``MOELayer.forward`` overwrites on itself; a replay restores them."""


@dataclass(frozen=True)
class Site:
    """One attribute of one module that holds a DeepSpeed process group."""

    module: nn.Module
    attr: str
    axis: Axis


def _group_classes() -> list[tuple[type[nn.Module], str, Axis]]:
    classes: list[tuple[type[nn.Module], str, Axis]] = []
    try:
        from deepspeed.sequence.layer import DistributedAttention

        classes.append((DistributedAttention, "spg", Axis.C))
    except ImportError:  # pragma: no cover - DeepSpeed without Ulysses
        pass
    try:
        from deepspeed.moe.sharded_moe import MOELayer, TopKGate

        classes.append((MOELayer, "ep_group", Axis.E))
        classes.append((TopKGate, "ep_group", Axis.E))
    except ImportError:  # pragma: no cover - DeepSpeed without MoE
        pass
    return classes


def find_sites(module: nn.Module) -> list[Site]:
    """Every group-holding attribute under ``module`` that replay must re-point."""
    classes = _group_classes()
    sites: list[Site] = []
    for sub in module.modules():
        for cls, attr, axis in classes:
            if isinstance(sub, cls) and getattr(sub, attr, None) is not None:
                sites.append(Site(sub, attr, axis))
    return sites


class Repointer:
    """SCOUT's diagnostic ``c`` / ``e`` groups and the model attributes to swap to them.

    Collective at construction (every rank, same layout). :attr:`problem` is None when every
    site holds this rank's layout group, else a message to agree on before :meth:`patched`.
    """

    def __init__(self, module: nn.Module, layout: MeshLayout, rank: int) -> None:
        self.sites = find_sites(module)
        self.groups: dict[Axis, dist.ProcessGroup] = {}
        self.members: dict[Axis, tuple[int, ...]] = {}
        for axis in (Axis.C, Axis.E):
            if layout.size(axis) <= 1:
                continue
            partition = layout.groups((axis,))
            self.groups[axis] = diagnostic_groups(partition, timeout=DIAGNOSTIC_TIMEOUT)
            self.members[axis] = next(tuple(r) for r in partition if rank in r)
        self.problem = self._check()

    def _check(self) -> str | None:
        for site in self.sites:
            held = group_ranks(getattr(site.module, site.attr))
            if len(held) <= 1:
                continue  # a one-rank group issues no traffic worth re-pointing
            mine = self.members.get(site.axis)
            if mine is None:
                return (
                    f"{type(site.module).__name__}.{site.attr} holds a {len(held)}-rank group "
                    f"{list(held)}, but the layout has no {site.axis.value!r} axis"
                )
            if held != tuple(sorted(mine)) or group_ranks(self.groups[site.axis]) != held:
                return (
                    f"{type(site.module).__name__}.{site.attr} holds ranks {list(held)}, but "
                    f"this rank's {site.axis.value!r} group in the layout is {list(mine)}"
                )
        return None

    def summary(self) -> dict[str, list[int]]:
        """``"<Class>.<attr>"`` -> diagnostic group ranks, for reports and tests."""
        out: dict[str, list[int]] = {}
        for site in self.sites:
            if site.axis in self.members:
                out[f"{type(site.module).__name__}.{site.attr}"] = list(self.members[site.axis])
        return out

    @contextmanager
    def patched(self, module: nn.Module) -> Iterator[None]:
        """Inside: every site under ``module`` holds SCOUT's group; restored on exit."""
        inside = {id(m) for m in module.modules()}
        chosen = [s for s in self.sites if id(s.module) in inside and s.axis in self.groups]
        with swapped_attributes(
            [(s.module, s.attr, self.groups[s.axis]) for s in chosen],
            keep=[(s.module, name) for s in chosen for name in _STATE_ATTRS],
        ):
            yield
