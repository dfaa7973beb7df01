"""Replaying a tensor-parallel Megatron layer without talking on Megatron's process groups.

Contract: inside :meth:`Regrouper.repointed`, every multi-rank process group held under the
module (``tp_group``, ``pg_collection``) is SCOUT's substitute over the same ranks, or a
:class:`Forbidden` stand-in that refuses traffic; shared ``pg_collection`` objects are copied,
never mutated, and every attribute is put back on exit, also on error. Where megatron-core keeps
its groups and what is re-pointed: docs/megatron.md, "Replaying tensor-parallel layers".
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch import nn

from scout_core import ScoutError
from scout_core.plugin_api import group_ranks, swapped_attributes

__all__ = ["Forbidden", "ForbiddenGroupError", "GroupSite", "Regrouper"]


class ForbiddenGroupError(ScoutError):
    """A replayed call tried to use a training group that SCOUT has no substitute for."""


class Forbidden:
    """Stands in for a training group during replay: local queries only."""

    def __init__(self, ranks: tuple[int, ...], rank: int) -> None:
        self._ranks = ranks
        self._rank = rank

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return len(self._ranks)

    def __getattr__(self, name: str) -> Any:
        raise ForbiddenGroupError(
            f"a replayed call used {name!r} of Megatron's process group {list(self._ranks)}, "
            "which SCOUT has no substitute for; replay never talks on a training group"
        )

    def __repr__(self) -> str:
        return (
            f"Forbidden(ranks={list(self._ranks)}): a Megatron training group that SCOUT "
            "has no substitute for"
        )


@dataclass(frozen=True)
class GroupSite:
    """One reference to a multi-rank process group under a module."""

    module: str
    """Dotted path of the module holding it ('' for the root)."""
    attr: str
    """``tp_group``, or ``pg_collection.tp``, or ``pg_collection.hcp.0`` ..."""
    ranks: tuple[int, ...]
    substituted: bool
    """True when SCOUT has a substitute with these ranks (else it is forbidden)."""


def _field_names(value: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(value) if hasattr(value, f.name)]


def _is_collection(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


class Regrouper:
    """Re-points a module's process groups to SCOUT's substitutes: each of ``substitutes`` replaces
    the training groups with exactly its ordered ranks; ``by_ranks`` maps ordered ranks to one
    over other ranks (the single-rank group a decoupled replay uses for a TP group)."""

    def __init__(
        self,
        substitutes: Iterable[Any] = (),
        *,
        by_ranks: Mapping[tuple[int, ...], Any] | None = None,
    ) -> None:
        self._subs: dict[tuple[int, ...], Any] = {}
        for group in substitutes:
            self._subs[group_ranks(group)] = group
        self._subs.update({tuple(k): v for k, v in (by_ranks or {}).items()})
        self._rank = dist.get_rank()

    @property
    def substitutes(self) -> Mapping[tuple[int, ...], Any]:
        """Ordered ranks -> SCOUT's group."""
        return dict(self._subs)

    def _swap(self, group: Any) -> Any:
        ranks = group_ranks(group)
        if len(ranks) <= 1:
            return group
        sub = self._subs.get(ranks)
        return sub if sub is not None else Forbidden(ranks, self._rank)

    def _remap(self, value: Any, memo: dict[int, tuple[Any, Any]]) -> Any:
        # memo holds the original too, so its id cannot be reused while the block runs.
        if id(value) in memo:
            return memo[id(value)][1]
        new = value
        if isinstance(value, dist.ProcessGroup):
            new = self._swap(value)
        elif isinstance(value, (list, tuple)) and any(
            isinstance(v, dist.ProcessGroup) for v in value
        ):
            new = type(value)(self._remap(v, memo) for v in value)
        elif _is_collection(value):
            changed = {}
            for name in _field_names(value):
                field = getattr(value, name)
                if isinstance(field, (dist.ProcessGroup, list, tuple)):
                    swapped = self._remap(field, memo)
                    if swapped is not field:
                        changed[name] = swapped
            if changed:
                new = copy.copy(value)
                for name, swapped in changed.items():
                    object.__setattr__(new, name, swapped)
        memo[id(value)] = (value, new)
        return new

    def sites(self, module: nn.Module) -> list[GroupSite]:
        """Every multi-rank group reference under ``module`` and whether it has a substitute."""
        out: list[GroupSite] = []
        for path, mod in module.named_modules():
            for name, value in vars(mod).items():
                for attr, group in _groups_in(name, value):
                    ranks = group_ranks(group)
                    if len(ranks) > 1:
                        out.append(GroupSite(path, attr, ranks, ranks in self._subs))
        return out

    @contextmanager
    def repointed(self, module: nn.Module) -> Iterator[None]:
        """Inside: ``module`` and its submodules hold SCOUT's groups (or stand-ins)."""
        memo: dict[int, tuple[Any, Any]] = {}

        def changes() -> Iterator[tuple[nn.Module, str, Any]]:
            for mod in module.modules():
                for name, value in list(vars(mod).items()):
                    new = self._remap(value, memo)
                    if new is not value:
                        yield mod, name, new

        with swapped_attributes(changes()):
            yield


def _groups_in(name: str, value: Any, nested: bool = True) -> Iterator[tuple[str, Any]]:
    """Groups held by one attribute: directly, in a list, or one collection down (as ``_remap``)."""
    if isinstance(value, dist.ProcessGroup):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if isinstance(item, dist.ProcessGroup):
                yield f"{name}.{i}", item
    elif nested and _is_collection(value):
        for field in _field_names(value):
            yield from _groups_in(f"{name}.{field}", getattr(value, field), nested=False)
