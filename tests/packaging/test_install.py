"""Installing SCOUT the way the README says works, under names that are ours.

Two installs into fresh virtual environments, each checked by importing the core and
the DeepSpeed plugin from *that* environment and by ``scout --version``:

* the README's line from a clean copy of the repository,
  ``pip install ".[deepspeed]" ./plugins/deepspeed``;
* the built wheels, ``pip install --find-links dist "scout-core[deepspeed]"``: the extra
  must resolve to our plugin distribution, and the plugin to our core.

The fresh environments see the test environment's third-party packages (torch,
DeepSpeed, ...) through a ``.pth`` file over a filtered view of its site-packages, with
every SCOUT distribution left out, and pip runs with ``--no-index``: so the only SCOUT
code they can get is what the install under test puts there, and nothing is downloaded
(a CUDA torch is several GB).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
OURS = {"scout-core", "scout-deepspeed", "scout-megatron", "scout-torchtitan"}
README_LINE = 'pip install ".[deepspeed]" ./plugins/deepspeed'


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    # No PYTHONPATH: the fresh environment must import only what was installed into it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        cmd, check=False, cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _fresh_env(where: Path) -> Path:
    """A new venv that sees the current environment's third-party packages, not SCOUT's."""
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).strip()
    )
    view = where / "deps-view"
    view.mkdir()
    ours = re.compile(r"^(scout[_-]|__editable__|_?scout)", re.IGNORECASE)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not ours.match(entry.name):
            (view / entry.name).symlink_to(entry)
    (site / "zz_test_deps.pth").write_text(f"{view}\n")
    # The venv's bundled setuptools would shadow the build backend the project asks for.
    _run([str(python), "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
    return python


def _check(python: Path, where: Path) -> None:
    code = (
        "import scout_core, scout_deepspeed, sys; "
        "print(scout_core.__file__); print(scout_deepspeed.__file__)"
    )
    # cwd: the env, so that "python -c" does not import the checkout it was started from.
    files = _run([str(python), "-c", code], cwd=where).split()
    for f in files:
        assert Path(f).resolve().is_relative_to(where.resolve()), f"imported from outside: {f}"
    version = _run([str(where / "bin" / "scout"), "--version"], cwd=where)
    assert version.startswith("scout-core "), version


def test_distribution_names_are_ours() -> None:
    names = set()
    for path in [ROOT / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml"))]:
        project = tomllib.loads(path.read_text())["project"]
        names.add(project["name"])
        deps = [*project.get("dependencies", [])]
        for extra in project.get("optional-dependencies", {}).values():
            deps += extra
        named = {re.split(r"[\s<>=!~;\[@]", d, maxsplit=1)[0].lower() for d in deps}
        assert "scout" not in named, f"{path}: 'scout' on the index is an unrelated package"
        if path.parent != ROOT:
            assert "scout-core" in named, f"{path}: a plugin depends on scout-core"
    assert names == OURS


def test_readme_install_line_is_the_one_tested() -> None:
    assert README_LINE in (ROOT / "README.md").read_text()


@pytest.mark.timeout(900)
def test_readme_line_installs_core_and_plugin(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "build", "__pycache__"),
    )
    python = _fresh_env(tmp_path / "env")
    cmd = [str(python), "-m", *README_LINE.split()[:2], "--no-index", "--no-build-isolation"]
    cmd += [a.strip('"') for a in README_LINE.split()[2:]]
    _run(cmd, cwd=src)
    _check(python, tmp_path / "env")


@pytest.mark.timeout(900)
def test_wheels_install_with_the_extra(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*wheel, "-w", str(dist), str(ROOT), str(ROOT / "plugins" / "deepspeed")], cwd=tmp_path)
    built = sorted(p.name for p in dist.glob("*.whl"))
    assert [n.split("-")[0] for n in built] == ["scout_core", "scout_deepspeed"], built
    python = _fresh_env(tmp_path / "env")
    install = [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(dist)]
    _run([*install, "scout-core[deepspeed]"], cwd=tmp_path)
    _check(python, tmp_path / "env")
    listed = _run([str(python), "-m", "pip", "list", "--format=freeze"])
    assert "scout-core==0.1.0" in listed and "scout-deepspeed==0.1.0" in listed, listed
