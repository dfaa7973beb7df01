"""Shared set-up for the TorchTitan plugin tests.

TorchTitan 0.3 needs SCOUT's CPU shims before any of its trainer modules is imported
(``scout_torchtitan.testing.shims``), so they are installed here, when pytest loads
this directory. The tokenizer and dataset TorchTitan trains on are generated once
per session; every rank gets its own HuggingFace ``datasets`` cache under the
session's temp dir, offline.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scout_torchtitan.testing import TitanAssets, install_cpu_shims, write_assets

install_cpu_shims()


@pytest.fixture(scope="session")
def titan_assets(tmp_path_factory: pytest.TempPathFactory) -> TitanAssets:
    """The generated tokenizer and ``c4_test``-style dataset."""
    return write_assets(tmp_path_factory.mktemp("titan-assets"))


@pytest.fixture
def titan_env(tmp_path: Path) -> dict[str, str]:
    """Environment for TorchTitan ranks: one BLAS thread, a private offline HF cache."""
    return {
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }
