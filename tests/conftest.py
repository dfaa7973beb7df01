"""Fixtures shared by the core's test folders (``tests/docs``, ``tests/distributed``, ...)."""

from __future__ import annotations

import pytest
from sandbox import DemoRuns


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> DemoRuns:
    """One run per demo command line for the whole session (``sandbox.DemoRuns``)."""
    return DemoRuns(tmp_path_factory.mktemp("demo-runs"))
