"""The plugin API's collective helpers on real ranks (Gloo, CPU): ``agree_or_raise``
makes one rank's finding every rank's error, and a clean layout nobody's."""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed


def agree_body(bad: int | None) -> Any:
    import torch.distributed as dist

    from scout_core import UnsupportedSetupError
    from scout_core.plugin_api import agree_or_raise

    problem = "its TP group is [0, 2], the layout gives [0, 1]" if dist.get_rank() == bad else None
    try:
        agree_or_raise(problem, plugin="scout-test", what="the layout does not match")
    except UnsupportedSetupError as exc:
        return str(exc)
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad", [None, 1])
def test_one_ranks_problem_is_every_ranks_error(bad: int | None) -> None:
    out = run_ranks(agree_body, 3, args=(bad,), timeout_s=90)
    if bad is None:
        assert out == [None, None, None]
        return
    other = "scout-test: another rank found that the layout does not match (see its error)"
    assert out == [other, "scout-test: its TP group is [0, 2], the layout gives [0, 1]", other]
