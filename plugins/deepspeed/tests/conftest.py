"""Test set-up for scout-deepspeed.

Multi-rank tests import DeepSpeed only in their rank processes. Those processes are
forked from a zygote that has imported DeepSpeed and the plugin once and loaded
DeepSpeed's CPU shared-memory op (``SCOUT_TEST_PRELOAD`` =
:mod:`scout_deepspeed.zygote_preload`, ``scout_core/testing/zygotes.py``), so a rank
skips the import (about 3 s a rank on the 2-core CI machine) and the op's
build-directory lock (see that module). ``DS_*`` variables are part of the
zygote's key: ranks that set one get a zygote that imported DeepSpeed with it.
"""

from __future__ import annotations

import pytest

PRELOAD = "scout_deepspeed.zygote_preload"


@pytest.fixture(autouse=True)
def _ranks_preload_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOUT_TEST_PRELOAD", PRELOAD)
