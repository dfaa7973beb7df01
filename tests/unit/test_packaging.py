"""The supported Python and torch floors are stated once and agree everywhere.

The core supports Python 3.10 on and torch 2.11 on (the GPU host's torch). The project's
own environments pin torch 2.13.0; the plain-PyTorch plugin refuses an older torch at
activation with the same floor the distribution declares.
"""

from __future__ import annotations

from pathlib import Path

import tomllib
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from scout_core.plugin.torch_plugin import TorchPlugin

ROOT = Path(__file__).resolve().parents[2]
TORCH_FLOOR = SpecifierSet(">=2.11")
PYTHON_FLOOR = SpecifierSet(">=3.10")


def _project(path: Path) -> dict[str, object]:
    project = tomllib.loads(path.read_text())["project"]
    assert isinstance(project, dict)
    return project


def test_the_core_declares_python_310_and_torch_211() -> None:
    project = _project(ROOT / "pyproject.toml")
    assert SpecifierSet(str(project["requires-python"])) == PYTHON_FLOOR
    deps = [Requirement(d) for d in project["dependencies"]]  # type: ignore[attr-defined]
    assert [d.specifier for d in deps if d.name == "torch"] == [TORCH_FLOOR]


def test_each_plugin_declares_the_same_python_floor() -> None:
    for path in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        assert SpecifierSet(str(_project(path)["requires-python"])) == PYTHON_FLOOR, path


def test_the_torch_plugin_checks_the_declared_floor() -> None:
    assert SpecifierSet(TorchPlugin.supported) == TORCH_FLOOR
    assert Version("2.11.0") in TORCH_FLOOR and Version("2.10.1") not in TORCH_FLOOR
    installed = Version(torch.__version__.split("+")[0])
    assert installed in SpecifierSet(TorchPlugin.supported), installed
