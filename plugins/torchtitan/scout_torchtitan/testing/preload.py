"""Imported once by a test zygote (``SCOUT_TEST_PRELOAD``) before it forks TorchTitan ranks.

Installs the CPU shims first (they must precede TorchTitan's trainer modules), then
imports the modules every TorchTitan test rank imports, so a rank forked from the
zygote skips them (about 6 wall-seconds a rank on the 2-core CI machine). The
pytest process imports the same list (``plugins/torchtitan/tests/conftest.py``).
Import warnings are the caller's to silence: the zygote's stderr is discarded.
"""

from __future__ import annotations

import importlib

from scout_torchtitan.testing.shims import install_cpu_shims

MODULES = (
    "torchtitan.trainer",
    "torchtitan.train",
    "torchtitan.models.llama3.config_registry",
    "torchtitan.experiments.torchft.llama3.config_registry",
    "scout_torchtitan.testing.config_registry",
    "scout_torchtitan.testing.runner",
)

install_cpu_shims()
for _name in MODULES:
    importlib.import_module(_name)
