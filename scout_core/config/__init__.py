"""SCOUT's configuration: the schema, where values come from, and the per-field checks.

:mod:`.schema` holds :class:`Config` and :func:`fields_doc` (which docs/configuration.md is
written from), :mod:`.sources` files, ``SCOUT_*`` variables and sections, :mod:`.checks` the
per-field rules.
"""

from __future__ import annotations

from scout_core.config.checks import (
    GATE_MEMORY,
    ON_HANG_ACTIONS,
    ON_SDC_ACTIONS,
    RECIPES,
    RESERVED_EXIT_CODES,
)
from scout_core.config.schema import Config, fields_doc
from scout_core.config.sources import ENV_PREFIX, NON_CONFIG_ENV, NON_CONFIG_ENV_PREFIXES

__all__ = [
    "Config",
    "RECIPES",
    "GATE_MEMORY",
    "ON_HANG_ACTIONS",
    "ON_SDC_ACTIONS",
    "RESERVED_EXIT_CODES",
    "ENV_PREFIX",
    "NON_CONFIG_ENV",
    "NON_CONFIG_ENV_PREFIXES",
    "fields_doc",
]
