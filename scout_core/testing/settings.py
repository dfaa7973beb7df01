"""SCOUT settings for multi-rank tests on a shared, loaded CPU machine.

Several ranks and their observers share two cores in CI, where a rank descheduled for a
few tens of milliseconds inside a timed replay is common. A real job on a busy host
would raise the straggler thresholds the same way (docs/configuration.md, *On a busy
host*); every plugin's tests and the core's use this one value, so a clean run is held
to the same standard everywhere, and an injected straggler must clear it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BUSY_HOST"]

BUSY_HOST: Mapping[str, float] = {"straggler_min_excess_s": 0.3}
"""The settings (module doc): a timing outlier counts only 0.3 s above its peers' median."""
