"""Megatron-Bridge's callback API (``megatron.bridge.training.callbacks``), loadable on CPU.

Bridge's callback system is the one real "Megatron callback": ``pretrain(config,
forward_step_func, callbacks=[...])`` fires the events of each ``Callback`` through a
``CallbackManager``. In Bridge 0.3.1 (the newest release for Python 3.11):

* events (``VALID_EVENTS``): ``on_train_start``, ``on_train_step_start``,
  ``on_train_step_end``, ``on_train_end`` and the ``eval`` and ``test`` variants of
  each; every ``Callback`` method takes one ``CallbackContext`` and returns None.
  There is **no** ``on_checkpoint_save`` in 0.3.1 (it arrives in a later release).
* ``CallbackContext`` fields: ``state`` (Bridge's ``GlobalState``; ``state.train_state.
  step`` counts completed iterations), ``model`` (list of model chunks), ``user_state``
  (the manager's dict), ``optimizer`` (``MegatronOptimizer``), ``scheduler``,
  ``loss_dict``, ``grad_norm``, ``skipped_iter`` (the last three in
  ``on_train_step_end``), ``total_loss_dict`` (eval / test end).
* ``CallbackManager``: ``add(callback | [callbacks])`` registers the methods a
  subclass overrides, ``register(event, fn)``, ``fire(event, context)``, ``user_state``,
  ``has_callbacks(event)``; ``normalize_callbacks`` turns ``pretrain``'s argument into
  a manager.
* In ``train()`` a new context is built for each event; ``on_train_step_start`` and
  ``on_train_step_end`` of iteration ``k`` (0-based) both see ``train_state.step == k``
  (the counter is incremented after ``on_train_step_end``), and interval checkpoints
  are saved after the increment.

Bridge's package ``__init__`` imports its model bridges (``transformers``, Transformer
Engine), so ``import megatron.bridge...`` fails on a CPU host; ``callbacks.py`` itself
imports only the standard library. :func:`bridge_callbacks` returns the module Bridge
uses when it is already imported (a real Bridge job), and otherwise loads the
installed file by path under a private module name.
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
    """Bridge's callbacks module: Bridge's own when imported, else the installed file.

    With ``import_package`` an import of Bridge is tried first (it works where Bridge's
    dependencies are installed); a failed import falls back to loading by path.
    """
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
