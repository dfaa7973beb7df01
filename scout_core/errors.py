"""The errors SCOUT raises, in one place.

Contract: everything SCOUT raises on purpose derives from :class:`ScoutError`;
:class:`ConfigError` is also a ``ValueError``. Errors name what is wrong and list a fixed
set's valid values. The hierarchy: docs/operations.md, "Errors SCOUT raises".
"""

from __future__ import annotations

__all__ = [
    "CatalogDriftError",
    "CatalogError",
    "CheckpointError",
    "ConfigError",
    "EvidenceError",
    "PluginNotReadyError",
    "ProtocolError",
    "ScoutError",
    "UnsupportedSetupError",
]


class ScoutError(Exception):
    """Base class of every error SCOUT raises on purpose."""


class ConfigError(ScoutError, ValueError):
    """A configuration key or value is invalid; the message names the key."""


class UnsupportedSetupError(ScoutError):
    """``enable`` cannot watch this object or parallel layout."""


class PluginNotReadyError(UnsupportedSetupError):
    """A framework plugin is installed but its adapter is not implemented yet."""


class EvidenceError(ScoutError):
    """An evidence record or a report directory does not follow the schema."""


class ProtocolError(ScoutError):
    """Peers disagree about the shape of a collective that SCOUT itself runs."""


class CheckpointError(ScoutError):
    """A checkpoint generation is missing, partial, corrupt or inconsistent across ranks."""


class CatalogError(ScoutError):
    """An MoE shape catalog is malformed, or its cover does not cover its shapes."""


class CatalogDriftError(CatalogError):
    """A shape catalog was discovered for another environment; ``drift`` lists what changed."""

    def __init__(self, message: str, drift: list[str]) -> None:
        super().__init__(message)
        self.drift = drift
