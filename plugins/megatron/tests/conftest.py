"""Test set-up for scout-megatron.

Importing megatron-core warns, once per process: it reports that Transformer Engine
and Apex are missing (true on a CPU machine; it falls back to local implementations),
and the torch modules it pulls in (``torch._inductor``, ``torch.utils.mkldnn``) emit
deprecation warnings of their own. pytest turns warnings into errors, so a test that
imports megatron-core in the pytest process asks for the ``megatron_core`` fixture,
which imports the modules the tests use once, with warnings ignored; later imports
find them cached. Warnings raised by SCOUT's code during a test are still errors.
Multi-rank tests import megatron-core only in their rank processes. Those processes
are forked from a zygote that has imported the same modules once
(``SCOUT_TEST_PRELOAD``, ``scout_core/testing/zygotes.py``): about 11 CPU-seconds saved
per rank.
"""

from __future__ import annotations

import importlib
import warnings

import pytest

MEGATRON_MODULES = (
    "megatron.core.dist_checkpointing",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
)


@pytest.fixture(scope="session")
def megatron_core() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MEGATRON_MODULES:
            importlib.import_module(name)


@pytest.fixture(autouse=True)
def _ranks_preload_megatron(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOUT_TEST_PRELOAD", ",".join(MEGATRON_MODULES))
