"""The TorchTitan releases this plugin supports, and how older ones are told apart.

Contract: the plugin supports TorchTitan 0.3 (``Configurable`` components, ``config_registry``,
``torchtitan.config.override``); 0.2.x and older is a different design, refused with a message
saying so. The version comes from distribution metadata; a source checkout's placeholder falls
back to the API (the 0.3 override module means 0.3, 0.2's ``train_spec`` / ``job_config``
modules mean 0.2 or older). The range check is the core's (``plugin_api.check_version``);
the refusal says which design the installed release has. Docs: docs/torchtitan.md.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

from scout_core import UnsupportedSetupError
from scout_core.plugin_api import check_version as check_range

__all__ = [
    "SUPPORTED_RANGE",
    "check_version",
    "detect_api",
    "parse_version",
]

SUPPORTED_RANGE = ">=0.3,<0.4"
"""Every 0.3.x release (the one tested is 0.3.0); ``pyproject.toml`` pins it too."""
_OLDEST = (0, 3)
"""Releases before this one are the 0.2 design (TOML configs)."""

_OLD_API = ("torchtitan.protocols.train_spec", "torchtitan.config.job_config")
_NEW_API = "torchtitan.config.override"


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of ``"0.3.0"``, ``"0.3.0.dev20260101+cpu"``...; None if unreadable."""
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def detect_api() -> str:
    """``"0.3"`` (Configurable + override), ``"<=0.2"`` (TOML + custom_import) or ``"unknown"``."""
    if _has(_NEW_API):
        return "0.3"
    if any(_has(m) for m in _OLD_API):
        return "<=0.2"
    return "unknown"


def _installed() -> str:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedSetupError(
            f"scout-torchtitan needs TorchTitan {SUPPORTED_RANGE}, which is not installed "
            f"(pip install 'torchtitan{SUPPORTED_RANGE}')"
        ) from None


def check_version(version: str | None = None, *, api: str | None = None) -> str:
    """The version checked; ``UnsupportedSetupError`` unless TorchTitan is 0.3.x. ``version``
    defaults to the installed one; ``api`` (:func:`detect_api`) decides for ``0.0.0`` checkouts."""
    version = _installed() if version is None else version
    got = parse_version(version)
    if got is not None and got != (0, 0):
        try:  # the core's range check; only the refusal's wording is TorchTitan's
            return check_range(
                "torchtitan", SUPPORTED_RANGE, plugin="scout-torchtitan", version=version
            )
        except UnsupportedSetupError:
            old = got < _OLDEST
    else:
        kind = detect_api() if api is None else api
        if kind == "0.3":
            return version
        old = kind == "<=0.2"
    detail = (
        "it uses TOML job configs, TrainSpec and [experimental] custom_import, which "
        "have no override seam for SCOUT"
        if old
        else "its config and override interfaces are not the ones this plugin was tested on"
    )
    raise UnsupportedSetupError(
        f"scout-torchtitan supports TorchTitan {SUPPORTED_RANGE} (0.3.x: Configurable "
        f"configs switched on with --override.imports); TorchTitan {version} is installed "
        f"and {detail}. Install a supported release (pip install 'torchtitan{SUPPORTED_RANGE}') "
        "or a scout-torchtitan that declares this one."
    )
