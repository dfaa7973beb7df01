"""The megatron-core releases this plugin supports, and how the installed one is read.

Contract: :data:`SUPPORTED` is every release from 0.16 to 0.19 (tested: :data:`TESTED`); the
installed version comes from the ``megatron-core`` distribution's metadata, or for a source
checkout from ``megatron/core/package_info.py`` parsed as text (nothing is imported). The core
checks it at activation; :mod:`scout_megatron.probes` checks the internals. Docs: docs/megatron.md.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

from scout_core import UnsupportedSetupError
from scout_core.plugin_api import check_version as check_range

__all__ = ["SUPPORTED", "TESTED", "check_version", "installed_version", "version_from_package_info"]

SUPPORTED = ">=0.16,<0.20"

TESTED = ("0.16.1", "0.19.2")
"""The releases the plugin's tests ran on (docs/megatron.md: which tests on which)."""


def version_from_package_info(path: str | Path) -> str:
    """The version a ``megatron/core/package_info.py`` declares, without running it."""
    values: dict[str, object] = {}
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                values[target.id] = node.value.value
    try:
        major, minor, patch = (int(str(values[k])) for k in ("MAJOR", "MINOR", "PATCH"))
    except (KeyError, ValueError):
        raise UnsupportedSetupError(f"cannot read the megatron-core version from {path}") from None
    return f"{major}.{minor}.{patch}{values.get('PRE_RELEASE') or ''}"


def installed_version() -> str:
    """The installed megatron-core version (distribution metadata, else ``package_info.py``)."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("megatron")  # a namespace package: nothing runs
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        info = Path(root) / "core" / "package_info.py"
        if info.is_file():
            return version_from_package_info(info)
    raise UnsupportedSetupError(
        f"megatron-core is not installed; scout-megatron needs megatron-core{SUPPORTED}"
    )


def check_version(version: str | None = None) -> str:
    """The installed (or given) megatron-core version if in :data:`SUPPORTED`, else
    :class:`~scout_core.UnsupportedSetupError` naming both (the plugin's own check)."""
    found = installed_version() if version is None else version
    return check_range("megatron-core", SUPPORTED, plugin="scout-megatron", version=found)
