"""The campaign's plan is a function of the seed: same seed, same injections (no training)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from scout_core.campaign.plan import QUICK_SETUPS, SETUPS, draw_plan, missing_module, setup_named
from scout_core.testing.trial import FAULT_KINDS


def test_same_seed_same_plan_and_another_seed_another() -> None:
    names = [s.name for s in SETUPS]
    a = draw_plan(5, trials=60, setups=names)
    b = draw_plan(5, trials=60, setups=names)
    assert a == b
    assert draw_plan(6, trials=60, setups=names) != a


def test_a_plan_covers_every_kind_evenly_and_stays_in_range() -> None:
    plan = draw_plan(1, trials=3 * len(FAULT_KINDS), setups=QUICK_SETUPS)
    assert Counter(t.kind for t in plan) == {k: 3 for k in FAULT_KINDS}
    for t in plan:
        assert t.setup in QUICK_SETUPS
        assert (t.victim is None) == (t.kind == "clean")
        assert t.victim is None or 0 <= t.victim < t.world
        assert 2 <= t.step < t.steps


def test_the_plan_is_the_same_in_two_processes() -> None:
    """``--plan`` prints the drawn plan and runs nothing; two interpreters agree."""
    cmd = [sys.executable, "-m", "scout_core", "campaign", "--quick", "--seed", "1", "--plan"]
    outs = [
        subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
        for _ in range(2)
    ]
    assert outs[0] == outs[1]
    lines = [x for x in outs[0].splitlines() if x.strip().startswith("plan #")]
    assert len(lines) == len(FAULT_KINDS)


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown setup"):
        setup_named("horovod")
    with pytest.raises(ValueError, match="unknown fault kinds"):
        draw_plan(0, trials=2, setups=["ddp"], kinds=["cosmic_ray"])


def test_a_setup_without_its_framework_is_reported_missing() -> None:
    from dataclasses import replace

    ghost = replace(setup_named("megatron"), requires=("no_such_framework_xyz",))
    assert missing_module(ghost) == "no_such_framework_xyz"
    assert missing_module(setup_named("ddp")) is None
