"""The architecture's import rules, checked from the AST.

* Plugins and examples import only the published names (``scout_core.__all__``,
  ``scout_core.plugin_api.__all__``, ``scout_core.testing.__all__``).
* ``scout_core`` has no import cycle (runtime imports, module and function level).

Each rule is also fed a broken input, to prove it can fail.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from import_rules import (
    ALLOWED,
    find_cycles,
    folder_graph,
    import_graph,
    plugin_violations,
    session_reaches,
)

ROOT = Path(__file__).resolve().parents[2]


def _exported() -> dict[str, set[str]]:
    import importlib

    return {name: set(importlib.import_module(name).__all__) for name in ALLOWED}


def _plugin_files() -> list[Path]:
    """Every file of the plugins, the examples and the smallest test plugin."""
    roots = ("plugins", "examples", "tests/plugin_minimal")
    files = [p for root in roots for p in sorted((ROOT / root).rglob("*.py"))]
    return [p for p in files if ".venv" not in p.parts]


def test_plugins_and_examples_import_only_the_published_interface() -> None:
    exported = _exported()
    files = _plugin_files()
    assert len(files) >= 15, "the walk found too few files: the check would prove nothing"
    found = []
    for path in files:
        found += plugin_violations(path.read_text(encoding="utf-8"), str(path), exported)
    assert not found, "imports outside the plugin interface:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "from scout_core.session import Session",
        "import scout_core.replay.taps",
        "from scout_core.replay import taps",
        "def f():\n    from scout_core.checkpoint.attach import GateHandle",
        "from scout_core import enable_torch",
        "from scout_core.plugin_api import ReplayDriver",
        "from scout_core.testing import *",
        "class A:\n    def m(self):\n        import scout_core.integration.adapter as a",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scout_core.errors import X",
    ],
)
def test_the_plugin_rule_fails_on_internal_imports(snippet: str) -> None:
    assert plugin_violations(snippet, "bad.py", _exported())


@pytest.mark.parametrize(
    "snippet",
    [
        "import scout_core",
        "import scout_core.plugin_api",
        "from scout_core import Config, ConfigError",
        "from scout_core.plugin_api import FrameworkPlugin, CheckpointIO",
        "def f():\n    from scout_core.testing import run_ranks, TinyLM",
        "from scout_deepspeed.adapter import inner_optimizer",
        "from . import zero3",
    ],
)
def test_the_plugin_rule_accepts_the_published_names(snippet: str) -> None:
    assert plugin_violations(snippet, "ok.py", _exported()) == []


def test_scout_core_has_no_import_cycle() -> None:
    graph = import_graph(ROOT / "scout_core")
    assert len(graph) > 60 and sum(map(len, graph.values())) > 100, "graph too small to mean much"
    cycles = find_cycles(graph)
    assert not cycles, f"import cycles in scout_core: {cycles}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return pkg


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import thing\n",
            "sub/__init__.py": "",
            "sub/c.py": "from ..a import thing\n",
            "b.py": "def thing():\n    from pkg.sub import c\n    return c\n",
        },
    )
    assert find_cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.sub.c"]]


def test_the_cycle_check_ignores_type_checking_imports(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from pkg.a import A\n"
                "else:\n"
                "    import os\n"
            ),
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == set()
    assert find_cycles(graph) == []


def test_adding_a_cycle_to_scout_core_is_caught(tmp_path: Path) -> None:
    """The real package plus one function-level import back into the session module."""
    import shutil

    copy = tmp_path / "scout_core"
    shutil.copytree(ROOT / "scout_core", copy)
    driver = copy / "replay" / "driver.py"
    driver.write_text(
        driver.read_text(encoding="utf-8")
        + "\n\ndef _back() -> None:\n    from scout_core.session import Session  # noqa\n",
        encoding="utf-8",
    )
    cycles = find_cycles(import_graph(copy))
    assert any({"scout_core.replay.driver", "scout_core.session"} <= set(c) for c in cycles)


# -- every import counted: TYPE_CHECKING, plugins, folders --------------------------------


def _packages() -> list[Path]:
    """``scout_core`` and each plugin's package."""
    plugins = sorted(p.parent for p in (ROOT / "plugins").glob("*/scout_*/__init__.py"))
    return [ROOT / "scout_core", *plugins]


def test_no_cycle_counting_type_checking_imports_between_files_or_folders() -> None:
    packages = _packages()
    assert len(packages) == 4, f"expected scout_core and three plugins, found {packages}"
    for pkg in packages:
        graph = import_graph(pkg, type_checking=True)
        assert len(graph) >= 8, f"{pkg.name}: graph too small to mean much"
        assert not find_cycles(graph), f"file cycles in {pkg.name}: {find_cycles(graph)}"
        folders = find_cycles(folder_graph(graph))
        assert not folders, f"a loop of folders in {pkg.name}: {folders}"


def test_the_report_room_sits_on_records_and_only_the_cli_uses_it() -> None:
    """``scout_core.report`` draws what ``records`` reads; nothing below the CLI draws."""
    folders = folder_graph(import_graph(ROOT / "scout_core", type_checking=True))
    assert folders["scout_core.report"] == {"scout_core.records", "scout_core.vocabulary"}
    users = {source for source, targets in folders.items() if "scout_core.report" in targets}
    assert users == {"scout_core.cli"}


def test_the_type_checking_count_finds_a_cycle_the_runtime_graph_misses(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
            ),
        },
    )
    assert find_cycles(import_graph(pkg)) == []
    assert find_cycles(import_graph(pkg, type_checking=True)) == [["pkg.a", "pkg.b"]]


def test_the_folder_check_fails_on_a_loop_of_folders_without_a_file_cycle(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "",
            "low/x.py": "from pkg.high import y\n",
            "low/z.py": "",
            "high/__init__.py": "",
            "high/y.py": "",
            "high/w.py": "from pkg.low import z\n",
        },
    )
    graph = import_graph(pkg, type_checking=True)
    assert find_cycles(graph) == []
    assert find_cycles(folder_graph(graph)) == [["pkg.high", "pkg.low"]]


def test_a_planted_type_checking_cycle_in_scout_core_is_caught(tmp_path: Path) -> None:
    """The real package plus a TYPE_CHECKING import of the session into the gate machine."""
    import shutil

    copy = tmp_path / "scout_core"
    shutil.copytree(ROOT / "scout_core", copy)
    gate = copy / "checkpoint" / "coordinator.py"
    gate.write_text(
        gate.read_text(encoding="utf-8")
        + "\nif TYPE_CHECKING:\n    from scout_core.session import Session  # noqa\n",
        encoding="utf-8",
    )
    graph = import_graph(copy, type_checking=True)
    assert any("scout_core.session" in c for c in find_cycles(graph))
    loops = find_cycles(folder_graph(graph))
    assert any({"scout_core.checkpoint", "scout_core.session"} <= set(c) for c in loops)


def test_plugins_read_no_session_internals() -> None:
    """Plugin product code (tests may look inside) reads the session's facade only."""
    files = [p for p in _plugin_files() if p.parent.name.startswith("scout_")]
    assert len(files) >= 30, "the walk found too few plugin modules"
    found = []
    for path in files:
        found += session_reaches(path.read_text(encoding="utf-8"), str(path))
    assert not found, "plugins reading a session's internals:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "peers = session.replay.peers",
        "plugin.session_of(trainer).replay.step",
        "self.session.observer.publisher",
        "live_session.adapter.rank()",
    ],
)
def test_the_session_rule_fails_on_a_plugin_reaching_internals(snippet: str) -> None:
    assert session_reaches(snippet, "bad.py")


@pytest.mark.parametrize(
    "snippet",
    ["session.step", "session.gate.recover('sdc')", "replay.peers", "session.on_boundary(fn)"],
)
def test_the_session_rule_accepts_the_facade(snippet: str) -> None:
    assert session_reaches(snippet, "ok.py") == []
