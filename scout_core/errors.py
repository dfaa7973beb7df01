"""The errors SCOUT raises, in one place.

Everything SCOUT raises on purpose derives from :class:`ScoutError`, so a caller
can catch the whole family with one ``except``::

    ScoutError
    ├── ConfigError              bad key or value in Config / a config file / SCOUT_* env
    │                            (also a ValueError)
    ├── UnsupportedSetupError    enable() was handed something SCOUT cannot watch
    │   └── PluginNotReadyError  the framework's plugin exists but is not built yet
    ├── EvidenceError            a report directory or evidence record is malformed
    ├── ProtocolError            peers disagree about a collective SCOUT itself runs
    │                            (for example a different surface layout in one C3)
    ├── CheckpointError          a checkpoint or its manifest is missing, partial or corrupt
    └── CatalogError             an MoE shape catalog file is malformed or does not cover
        │                        its shapes
        └── CatalogDriftError    the catalog was discovered for another environment
                                 (device, software stack, model config, profiler)

Errors name what is wrong and, where there is a fixed set of valid values, list them.
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
