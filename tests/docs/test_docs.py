"""Every code block of the README and ``docs/`` runs (or parses) as documented.

A block is either run here or carries the visible marker ``*Illustration, not run:*``
(``tests/docs/docs_blocks.py`` has the rules). Blocks run in a scratch directory that
links the repository's top-level entries (not those git ignores), so relative paths in the docs
(``examples/...``, ``.venv/bin/python``) work and what a block writes stays out of the
checkout. ``scout`` and ``python`` resolve to this interpreter's environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from docs_blocks import (
    DATA,
    RUN,
    Block,
    commands,
    expected_exit_code,
    extract,
    output_matches,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *ROOT.glob("plugins/*/README.md")]
)


def _collect() -> tuple[list[Block], list[str]]:
    """Every block of every page; a page that cannot be read is a failure of the test
    below, not an error that stops the whole suite from collecting."""
    blocks: list[Block] = []
    problems: list[str] = []
    for page in DOCS:
        try:
            blocks += extract(page, ROOT)
        except ValueError as exc:
            problems.append(str(exc))
    return blocks, problems


BLOCKS, PROBLEMS = _collect()
_END = "@@scout-docs-test-end@@"
# scripts/test.sh runs the whole suite; scripts/demo.sh is run (SCOUT_BOOTSTRAP_NO_INSTALL
# below keeps its bootstrap from reinstalling this interpreter's environment).
_INSTALLS = re.compile(r"\b(pip|pip3|uv|conda|apt-get)\b.*\binstall\b|scripts/test\.sh")


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    # The block's own timeout governs (``_run`` stops it and fails the test); pytest's
    # per-test limit (pyproject: 300 s) only backs it up, so it must not cut it short.
    marks = [pytest.mark.timeout(block.timeout_s + 60)]
    return [pytest.mark.slow, *marks] if block.slow else marks


def _params(langs: frozenset[str]) -> list[object]:
    return [
        pytest.param(b, id=b.id, marks=_marks(b))
        for b in BLOCKS
        if b.lang in langs and not b.illustration and not _INSTALLS.search(b.text)
    ]


def _ignored(names: list[str]) -> set[str]:
    """The top-level names git ignores (.venv, scout-demo-report, runs ...): outputs that
    a block must write into its scratch directory, never through a link into the checkout."""
    try:
        res = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "--stdin"],
            input="\n".join(names),
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(res.stdout.split())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    names = sorted(e.name for e in ROOT.iterdir() if e.name != ".git")
    for name in sorted(set(names) - _ignored(names)):
        (tmp_path / name).symlink_to(ROOT / name)
    if not (tmp_path / ".venv").exists():  # the docs' .venv is this interpreter's
        (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOUT_")}
    paths = [str(ROOT), *(str(p) for p in sorted((ROOT / "plugins").iterdir()) if p.is_dir())]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["HOME"] = str(workdir)
    # Python writes stdout in blocks to a pipe but line by line to a terminal: unbuffered,
    # a transcript's stdout and stderr lines interleave as the reader sees them.
    env["PYTHONUNBUFFERED"] = "1"
    env["SCOUT_BOOTSTRAP_NO_INSTALL"] = "1"  # scripts/*.sh: use this environment as it is
    return env


def _run(args: list[str], block: Block, workdir: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            args,
            check=False,
            cwd=workdir,
            env=_env(workdir),
            capture_output=True,
            text=True,
            timeout=block.timeout_s,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.id}: still running after {block.timeout_s:.0f} s: {exc.cmd}")


def test_every_block_is_run_or_marked() -> None:
    # The collection itself: languages we neither run nor parse must be prose only.
    assert BLOCKS, "no code blocks found: the docs test would pass vacuously"
    assert not PROBLEMS, "\n".join(PROBLEMS)
    for block in BLOCKS:
        if block.lang in ("", "py", "python3", "shell-session", "pycon"):
            pytest.fail(f"{block.id}: say the block's language as one of {sorted(RUN | DATA)}")
        if block.lang in RUN and not block.illustration and _INSTALLS.search(block.text):
            # Run here, it would change the environment the tests themselves run in.
            pytest.fail(f"{block.id}: an install command; mark the block as an illustration")


@pytest.mark.parametrize("block", _params(frozenset({"python"})))
def test_python_block(block: Block, workdir: Path) -> None:
    script = workdir / "block.py"
    script.write_text(block.text, encoding="utf-8")
    res = _run([sys.executable, str(script)], block, workdir)
    assert res.returncode == 0, f"{block.id} failed:\n{res.stdout}\n{res.stderr}"


@pytest.mark.parametrize("block", _params(frozenset({"bash", "sh", "shell"})))
def test_shell_block(block: Block, workdir: Path) -> None:
    res = _run(["bash", "-euo", "pipefail", "-c", block.text], block, workdir)
    assert res.returncode == 0, f"{block.id} failed:\n{res.stdout}\n{res.stderr}"


def _elide(output: str, workdir: Path) -> str:
    """The run's output with the scratch directory written ``...``, as the docs write the
    reader's own working directory (``evidence records: .../scout-demo-report``)."""
    for path in sorted({str(workdir.resolve()), str(workdir)}, key=len, reverse=True):
        output = output.replace(path, "...")
    return output


@pytest.mark.parametrize("block", _params(frozenset({"console"})))
def test_console_block(block: Block, workdir: Path) -> None:
    steps = commands(block.text)
    assert steps, f"{block.id}: a console block shows `$ ` commands (or use ```text)"
    script = []
    for step in steps:
        script += [
            f"{step.line}",
            "__rc=$?",
            f"echo {shlex.quote(_END)} $__rc",
            "(exit $__rc)",
        ]
    res = _run(["bash", "-c", "exec 2>&1\n" + "\n".join(script) + "\n"], block, workdir)
    parts = (res.stdout + "\n").split(_END)
    assert len(parts) == len(steps) + 1, f"{block.id}: the transcript stopped early:\n{res.stderr}"
    for i, step in enumerate(steps):
        output = parts[i] if i == 0 else parts[i].split("\n", 1)[1] if "\n" in parts[i] else ""
        output = _elide(output, workdir)
        rc = int(parts[i + 1].split("\n", 1)[0].split()[0])
        try:
            documented = expected_exit_code(steps, i)
        except ValueError as exc:
            pytest.fail(f"{block.id}: {exc}")
        assert rc == documented, (
            f"{block.id}: `{step.line}` exited {rc}, the transcript documents {documented}:"
            f"\n{output}\n{res.stderr}"
        )
        missing = output_matches(step.expected, output)
        assert missing is None, (
            f"{block.id}: `{step.line}` did not print the documented line\n  {missing}\n"
            f"it printed:\n{output}\n{res.stderr[-2000:]}"
        )


@pytest.mark.parametrize("block", _params(DATA))
def test_data_block(block: Block) -> None:
    try:
        if block.lang == "json":
            json.loads(block.text)
        else:
            tomllib.loads(block.text)
    except ValueError as exc:
        pytest.fail(f"{block.id}: does not parse as {block.lang}: {exc}")
