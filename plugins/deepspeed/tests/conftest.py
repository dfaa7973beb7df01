"""Test set-up for scout-deepspeed.

Multi-rank tests import DeepSpeed only in their rank processes. Those processes are
forked from a zygote that has imported DeepSpeed and the plugin once
(``SCOUT_TEST_PRELOAD``, ``scout_core/testing/zygotes.py``), so a rank skips their
import (about 3 s a rank on the 2-core CI machine). ``DS_*`` variables are part of the
zygote's key: ranks that set one get a zygote that imported DeepSpeed with it.
"""

from __future__ import annotations

import pytest

DEEPSPEED_MODULES = ("deepspeed", "deepspeed.pipe", "scout_deepspeed")


@pytest.fixture(autouse=True)
def _ranks_preload_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOUT_TEST_PRELOAD", ",".join(DEEPSPEED_MODULES))
