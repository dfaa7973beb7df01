"""Shared set-up for the TorchTitan plugin tests.

TorchTitan 0.3 needs SCOUT's CPU shims before any of its trainer modules is imported
(``scout_torchtitan.testing.shims``), so they are installed here, when pytest loads
this directory. The tokenizer and dataset TorchTitan trains on are generated once
per session; every rank gets its own HuggingFace ``datasets`` cache under the
session's temp dir, offline.

[Import-time warnings]
Importing TorchTitan's model code compiles helpers at module level
(``torch.compile(create_block_mask)``), which imports Inductor, which trips torch's
own deprecation warnings (``torch.jit.script_method``). ``filterwarnings = error``
would turn those into collection errors of whichever test module imports TorchTitan
first, so the TorchTitan modules the tests use are imported here once, with
warnings ignored for that import only. Warnings raised while tests *run* stay errors.

[Ranks]
The same import (:mod:`scout_torchtitan.testing.preload`: the shims, then the
modules) is the zygote's preload (``SCOUT_TEST_PRELOAD``,
``scout_core/testing/zygotes.py``), so a multi-rank test's ranks are forked with
TorchTitan already imported instead of importing it each (about 6 s a rank here).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from pathlib import Path

import pytest
from scout_torchtitan.testing import TitanAssets, write_assets

PRELOAD = "scout_torchtitan.testing.preload"

if importlib.util.find_spec("torchtitan") is None:
    # Without TorchTitan (a GPU host running `scripts/gpu_check.sh` from the source
    # tree, or the core's own environment) this plugin's tests are not collected.
    collect_ignore_glob = ["*.py"]
else:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module(PRELOAD)  # the shims, then TorchTitan's modules


@pytest.fixture(scope="session")
def titan_assets(tmp_path_factory: pytest.TempPathFactory) -> TitanAssets:
    """The generated tokenizer and ``c4_test``-style dataset."""
    return write_assets(tmp_path_factory.mktemp("titan-assets"))


@pytest.fixture
def titan_dump(tmp_path: Path) -> str:
    """TorchTitan's ``--dump_folder`` for one test (its default, ./outputs, is the cwd)."""
    return str(tmp_path / "dump")


@pytest.fixture
def titan_env(tmp_path: Path) -> dict[str, str]:
    """Environment for TorchTitan ranks: one BLAS thread, a private offline HF cache."""
    return {
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.fixture(autouse=True)
def _ranks_preload_torchtitan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOUT_TEST_PRELOAD", PRELOAD)
