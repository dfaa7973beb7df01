"""Megatron-Bridge's callback API (``megatron.bridge.training.callbacks``), loadable on CPU.

Contract: :func:`bridge_callbacks` returns Bridge's callbacks module when already imported (a
real Bridge job), else loads the installed ``callbacks.py`` (standard library only) by path
under a private name, since Bridge's package ``__init__`` imports Transformer Engine. The API
facts relied on (events, context fields, ``train_state.step``): docs/megatron.md, "Switching it on".
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from scout_core import UnsupportedSetupError

__all__ = ["BRIDGE_MODULE", "bridge_callbacks", "bridge_version", "callbacks_file"]

BRIDGE_MODULE = "megatron.bridge.training.callbacks"
"""Where Bridge keeps ``Callback``, ``CallbackManager`` and ``CallbackContext``."""

_PRIVATE_NAME = "scout_megatron._bridge_callbacks"


def bridge_version() -> str | None:
    """The installed ``megatron-bridge`` distribution's version, or None."""
    try:
        return importlib.metadata.version("megatron-bridge")
    except importlib.metadata.PackageNotFoundError:
        return None


def callbacks_file() -> Path:
    """The installed ``megatron/bridge/training/callbacks.py``, found without importing Bridge."""
    spec = importlib.util.find_spec("megatron")  # a namespace package: nothing runs
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in locations:
        candidate = Path(root) / "bridge" / "training" / "callbacks.py"
        if candidate.is_file():
            return candidate
    raise UnsupportedSetupError(
        "Megatron-Bridge is not installed (no megatron/bridge/training/callbacks.py); "
        "install megatron-bridge>=0.3 (pip install --no-deps is enough for the callback API)"
    )


def bridge_callbacks(*, import_package: bool = False) -> ModuleType:
    """Bridge's callbacks module: Bridge's own when imported, else the installed file. With
    ``import_package``, importing Bridge is tried first (it needs Bridge's dependencies)."""
    module = sys.modules.get(BRIDGE_MODULE)
    if module is not None:
        return module
    if import_package:
        try:
            return importlib.import_module(BRIDGE_MODULE)
        except ImportError:
            pass
    loaded = sys.modules.get(_PRIVATE_NAME)
    if loaded is not None:
        return loaded
    path = callbacks_file()
    spec = importlib.util.spec_from_file_location(_PRIVATE_NAME, path)
    if spec is None or spec.loader is None:
        raise UnsupportedSetupError(f"cannot load Megatron-Bridge callbacks from {path}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[_PRIVATE_NAME] = loaded  # dataclasses resolve annotations through it
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[_PRIVATE_NAME]
        raise
    return loaded
