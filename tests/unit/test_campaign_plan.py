"""The campaign's plan is a function of the seed: same seed, same injections (no training)."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from scout_core.campaign import plan as plan_module
from scout_core.campaign.plan import QUICK_SETUPS, SETUPS, draw_plan, missing_module, setup_named
from scout_core.testing.trial import FAULT_KINDS, Setup

ROOT = Path(__file__).resolve().parents[2]


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


# -- setups come from entry points; the core names no plugin ------------------------------


GOOD_SETUPS = (Setup("toy-a", 2, "toy.campaign:trial_rank"), Setup("toy-b", 3, "toy:body"))
CLASHING = (Setup("ddp", 2, "toy:body"),)
NOT_SETUPS = ("ddp",)


def _entry_points(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    eps = [
        metadata.EntryPoint(name=n, value=v, group=plan_module.ENTRY_POINT_GROUP)
        for n, v in values.items()
    ]

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        assert group == plan_module.ENTRY_POINT_GROUP
        return eps

    monkeypatch.setattr(plan_module.metadata, "entry_points", entry_points)


def test_without_an_entry_point_there_is_no_plugin_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_points(monkeypatch, {})
    assert plan_module.plugin_setups() == ()


def test_broken_entries_are_skipped_and_good_ones_kept_in_entry_point_order(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _entry_points(
        monkeypatch,
        {
            "zz_good": f"{__name__}:GOOD_SETUPS",
            "aa_not_installed": "no_such_plugin_xyz.campaign:SETUPS",
            "bb_not_setups": f"{__name__}:NOT_SETUPS",
            "cc_clash": f"{__name__}:CLASHING",
        },
    )
    with caplog.at_level(logging.WARNING, logger="scout_core.campaign"):
        found = plan_module.plugin_setups(taken=["ddp"])
    assert found == GOOD_SETUPS
    for name in ("aa_not_installed", "bb_not_setups", "cc_clash"):
        assert name in caplog.text


def test_the_installed_plugins_register_the_framework_setups() -> None:
    """The core's four, then each plugin's, by entry-point name (the order tables use)."""
    assert [(s.name, s.world) for s in SETUPS] == [
        ("ddp", 4),
        ("fsdp2", 4),
        ("hsdp", 4),
        ("dptp", 4),
        ("deepspeed-zero1", 4),
        ("deepspeed-zero2", 4),
        ("deepspeed-zero3", 4),
        ("deepspeed-pipeline", 4),
        ("megatron", 6),
        ("torchtitan", 6),
    ]
    assert setup_named("torchtitan").init_process_group is False
    assert setup_named("deepspeed-zero3").options == {"zero_stage": 3}


def _plugin_packages() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "plugins").glob("*/scout_*/__init__.py"))


def names_a_plugin(source: str, filename: str, packages: list[str]) -> list[str]:
    """Imports of, and strings naming, any of ``packages`` in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        texts: list[Any] = []
        if isinstance(node, ast.Import):
            texts = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts = [node.value]
        hits = [p for p in packages for t in texts if p in t]
        out += [f"{filename}:{getattr(node, 'lineno', 0)}: {p}" for p in hits]
    return out


def test_the_core_names_no_plugin_module() -> None:
    packages = _plugin_packages()
    assert len(packages) == 3, packages
    files = sorted((ROOT / "scout_core").rglob("*.py"))
    assert len(files) > 100
    found = []
    for path in files:
        found += names_a_plugin(path.read_text(encoding="utf-8"), str(path), packages)
    assert not found, "the core names plugin code:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "import scout_megatron",
        "from scout_deepspeed.campaign import trial_rank",
        'BODY = "scout_torchtitan.campaign:trial_rank"',
        'def f():\n    return ("deepspeed", "scout_deepspeed")',
    ],
)
def test_the_plugin_name_check_fails_on_a_named_plugin(snippet: str) -> None:
    assert names_a_plugin(snippet, "bad.py", _plugin_packages())
