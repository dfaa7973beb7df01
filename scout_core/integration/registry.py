"""Plugin discovery and ``enable`` dispatch.

Framework plugins are distributions (``scout-deepspeed``, ...) that register a :class:`ScoutPlugin`
under the entry-point group ``scout.plugins``: it says whether it handles a training object and
enables SCOUT on it. Contract: discovery runs once per process; a plugin that fails to import or
breaks the protocol is logged and skipped, never fatal; plain PyTorch comes after all declined.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from scout_core.errors import UnsupportedSetupError

if TYPE_CHECKING:
    from scout_core.config import Config
    from scout_core.records.record import Record

__all__ = ["ENTRY_POINT_GROUP", "LoadedPlugin", "ScoutPlugin", "discover", "select_plugin"]

ENTRY_POINT_GROUP = "scout.plugins"
log = logging.getLogger(__name__)


@runtime_checkable
class ScoutPlugin(Protocol):
    """What a plugin's entry point resolves to."""

    name: str

    def handles(self, obj: object) -> bool:
        """Whether ``obj`` (an engine, trainer, model chunks, ...) belongs to this framework;
        cheap, and imports the framework only if ``obj`` already comes from it."""
        ...

    def enable(
        self,
        obj: object,
        *args: Any,
        config: Config | None,
        callback: Callable[[Record], None] | None,
        **kwargs: Any,
    ) -> Any:
        """Attach SCOUT to ``obj`` and return the session. Attaching twice is harmless."""
        ...


@dataclass(frozen=True)
class LoadedPlugin:
    """A discovered plugin and the entry point it came from."""

    name: str
    plugin: ScoutPlugin


_cache: list[LoadedPlugin] | None = None


def discover(*, refresh: bool = False) -> list[LoadedPlugin]:
    """Load every plugin registered under ``scout.plugins``; broken ones are logged and skipped."""
    global _cache  # noqa: PLW0603 - one discovery per process, like torch's rendezvous registry
    if _cache is not None and not refresh:
        return list(_cache)
    found: list[LoadedPlugin] = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
            plugin = obj() if isinstance(obj, type) else obj
        except Exception as exc:  # a broken plugin must not break the others
            log.warning("skipping plugin %r (%s): %s", ep.name, ep.value, exc)
            continue
        if not isinstance(plugin, ScoutPlugin):
            log.warning("skipping plugin %r (%s): it lacks name/handles/enable", ep.name, ep.value)
            continue
        found.append(LoadedPlugin(ep.name, plugin))
    _cache = found
    return list(found)


def select_plugin(
    obj: object, plugins: Sequence[LoadedPlugin] | None = None
) -> LoadedPlugin | None:
    """The first plugin (by entry-point name) that says it handles ``obj``, or None."""
    for loaded in discover() if plugins is None else plugins:
        try:
            if loaded.plugin.handles(obj):
                return loaded
        except Exception as exc:
            log.warning("plugin %r failed in handles(): %s", loaded.name, exc)
    return None


def describe_unsupported(obj: object) -> UnsupportedSetupError:
    """The error ``enable`` raises when nothing handles ``obj``."""
    names = [p.name for p in discover()]
    missing = [n for n in ("deepspeed", "megatron", "torchtitan") if n not in names]
    hint = (
        f" Other frameworks need their plugin: pip install 'scout-core[{missing[0]}]' "
        f"(from a clone: pip install '.[{missing[0]}]' ./plugins/{missing[0]})."
        if missing
        else ""
    )
    return UnsupportedSetupError(
        f"scout.enable: no plugin handles {type(obj).__module__}.{type(obj).__qualname__}. "
        f"Plain PyTorch needs enable(model: torch.nn.Module, optimizer: torch.optim.Optimizer); "
        f"a framework object needs its plugin. Installed plugins: "
        f"{', '.join(names) or 'none'}.{hint}"
    )
