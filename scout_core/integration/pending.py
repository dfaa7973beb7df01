"""Shared pieces for plugin distributions.

:class:`PendingPlugin` is what a plugin registers while its adapter is not built: it
recognises its framework's objects (so ``scout.enable`` does not say "no plugin handles
this"), then refuses with :class:`~scout_core.errors.PluginNotReadyError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scout_core.errors import PluginNotReadyError

__all__ = ["PendingPlugin", "object_from"]


def object_from(obj: object, prefixes: Sequence[str]) -> bool:
    """Whether ``obj`` (or a list's first item) comes from a package, judged by the module
    names of ``type(obj).__mro__`` (never importing a framework)."""
    if isinstance(obj, (list, tuple)) and obj:
        obj = obj[0]
    for cls in type(obj).__mro__:
        module = cls.__module__ or ""
        if any(module == p.rstrip(".") or module.startswith(p) for p in prefixes):
            return True
    return False


class PendingPlugin:
    """A registered plugin whose adapter is not implemented yet."""

    def __init__(self, name: str, prefixes: Sequence[str], distribution: str) -> None:
        self.name = name
        self._prefixes = tuple(prefixes)
        self._distribution = distribution

    def handles(self, obj: object) -> bool:
        return object_from(obj, self._prefixes)

    def enable(self, obj: object, *args: Any, **kwargs: Any) -> Any:
        raise PluginNotReadyError(
            f"{self._distribution} is installed but its {self.name} adapter is not built yet: "
            f"SCOUT cannot watch {type(obj).__name__} in this release. "
            "Use the plain-PyTorch path (scout.enable(model, optimizer)) meanwhile."
        )
