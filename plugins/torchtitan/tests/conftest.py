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
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from pathlib import Path

import pytest
from scout_torchtitan.testing import TitanAssets, install_cpu_shims, write_assets

if importlib.util.find_spec("torchtitan") is None:
    # Without TorchTitan (a GPU host running `scripts/gpu_check.sh` from the source
    # tree, or the core's own environment) this plugin's tests are not collected.
    collect_ignore_glob = ["*.py"]
else:
    install_cpu_shims()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _name in (
            "torchtitan.trainer",
            "torchtitan.train",
            "torchtitan.models.llama3.config_registry",
            "torchtitan.experiments.torchft.llama3.config_registry",
            "scout_torchtitan.testing.config_registry",
        ):
            importlib.import_module(_name)


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
