"""Every code block of the README and ``docs/`` runs (or parses) as documented.

A block is either run here or carries the visible marker ``*Illustration, not run:*``
(``tests/docs/docs_blocks.py`` has the rules). Blocks run in a scratch directory that
links the repository's top-level entries (not those git ignores), so relative paths in the docs
(``examples/...``, ``.venv/bin/python``) work and what a block writes stays out of the
checkout. ``scout`` and ``python`` resolve to this interpreter's environment
(``tests/sandbox.py``). A demo command in a transcript runs once per session, shared with
the other transcripts and tests that show the same command line (``sandbox.DemoRuns``).
"""

from __future__ import annotations

import json
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
from sandbox import DemoRuns, command_env, elide, make_sandbox

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


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return make_sandbox(tmp_path)


def _run(args: list[str], block: Block, workdir: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            args,
            check=False,
            cwd=workdir,
            env=command_env(workdir),
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


@pytest.mark.parametrize("block", _params(frozenset({"console"})))
def test_console_block(block: Block, workdir: Path, demo_runs: DemoRuns) -> None:
    steps = commands(block.text)
    assert steps, f"{block.id}: a console block shows `$ ` commands (or use ```text)"
    script = []
    for step in steps:
        # A demo command is run once per session, shared by every transcript that shows
        # it (and by the report tests): here its output, code and files are replayed.
        try:
            line = demo_runs.replay(step.line, block.timeout_s) or step.line
        except TimeoutError as exc:
            pytest.fail(f"{block.id}: {exc}")
        script += [
            line,
            "__rc=$?",
            f"echo {shlex.quote(_END)} $__rc",
            "(exit $__rc)",
        ]
    res = _run(["bash", "-c", "exec 2>&1\n" + "\n".join(script) + "\n"], block, workdir)
    parts = (res.stdout + "\n").split(_END)
    assert len(parts) == len(steps) + 1, f"{block.id}: the transcript stopped early:\n{res.stderr}"
    for i, step in enumerate(steps):
        output = parts[i] if i == 0 else parts[i].split("\n", 1)[1] if "\n" in parts[i] else ""
        output = elide(output, workdir)
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
