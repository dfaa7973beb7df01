"""Test support for TorchTitan on CPU: shims, generated assets, a tiny config, a runner.

Shipped in the plugin because SCOUT's own tests *and* the CPU example need it; a
production job never imports it. Importing this package imports no TorchTitan
module, so :func:`install_cpu_shims` can still run first.

* :func:`install_cpu_shims` / :func:`uninstall_cpu_shims`
  (:mod:`scout_torchtitan.testing.shims`): what TorchTitan 0.3 assumes about CUDA,
  patched narrowly and only where the machine needs it.
* :func:`write_assets` (:mod:`scout_torchtitan.testing.assets`): a deterministic
  byte-level tokenizer and ``c4_test``-style dataset in a directory of your choice.
* ``--module scout_torchtitan.testing --config tiny_llama3``
  (:mod:`scout_torchtitan.testing.config_registry`): the shrunk llama3 debug model
  with a math attention (:mod:`scout_torchtitan.testing.attention`).
* :func:`run_trainer`, :func:`launch_main`, :func:`titan_argv`, :func:`state_digest`
  (:mod:`scout_torchtitan.testing.runner`): drive ``torchtitan.train``'s flow (or its
  real ``main``) inside a rank of :func:`scout_core.testing.run_ranks` and report.
* ``python -m scout_torchtitan.testing.launch ...``: TorchTitan's entry point with
  the shims installed, for ``torchrun``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "install_cpu_shims",
    "uninstall_cpu_shims",
    "cpu_shims_installed",
    "needs_device_shim",
    "TitanAssets",
    "write_assets",
    "run_trainer",
    "titan_argv",
    "state_digest",
    "launch_main",
]

_HOME = {
    "install_cpu_shims": "shims",
    "uninstall_cpu_shims": "shims",
    "cpu_shims_installed": "shims",
    "needs_device_shim": "shims",
    "TitanAssets": "assets",
    "write_assets": "assets",
    "run_trainer": "runner",
    "titan_argv": "runner",
    "state_digest": "runner",
    "launch_main": "runner",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
