"""Where the docs' commands run, and the demo runs that several tests share.

A *sandbox* is a scratch directory that links the repository's top-level entries (not
those git ignores), so relative paths in the docs (``examples/...``, ``.venv/bin/python``)
work and what a command writes stays out of the checkout; :func:`command_env` makes
``scout`` and ``python`` resolve to this interpreter's environment there.

:class:`DemoRuns` runs each demo command line (``bash scripts/demo.sh``, ``scout demo
...``: a 4-rank job of about a minute on the 2-core CI machine) once per test session,
in a sandbox of its own, and keeps its output, exit code and the files it wrote. The
README's demo transcript, the two of ``docs/report.md`` and the report tests of
``tests/distributed/test_report_demo.py`` read one run per distinct command line
instead of starting a job each: a docs transcript replays the run's output and files at
its step (:meth:`DemoRuns.replay`), and is checked against it exactly as against a
command run there and then.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEMO", "DemoRun", "DemoRuns", "command_env", "elide", "make_sandbox"]

ROOT = Path(__file__).resolve().parents[1]

DEMO = re.compile(
    r"^(?P<command>(?:bash scripts/demo\.sh|(?:\.venv/bin/)?scout demo)(?:\s[^<>|;&$`'\"\\]*)?)"
    r"(?P<tail>\s*[<>|;&].*)?$"
)
"""A demo command line: the command (the README's ``bash scripts/demo.sh``, or ``scout
demo`` with plain arguments), then an optional redirection or pipe, kept apart."""


def _ignored(names: list[str]) -> set[str]:
    """The top-level names git ignores (.venv, scout-demo-report, runs ...): outputs that
    a command must write into its sandbox, never through a link into the checkout."""
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


def make_sandbox(path: Path) -> Path:
    """``path`` (created if missing) with a link to each of the checkout's top-level
    entries that git does not ignore, and ``.venv`` linked to this interpreter's."""
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(e.name for e in ROOT.iterdir() if e.name != ".git")
    for name in sorted(set(names) - _ignored(names)):
        (path / name).symlink_to(ROOT / name)
    if not (path / ".venv").exists():  # the docs' .venv is this interpreter's
        (path / ".venv").symlink_to(Path(sys.prefix))
    return path


def command_env(sandbox: Path) -> dict[str, str]:
    """The environment a documented command runs in, in ``sandbox``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOUT_")}
    paths = [str(ROOT), *(str(p) for p in sorted((ROOT / "plugins").iterdir()) if p.is_dir())]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["HOME"] = str(sandbox)
    # Python writes stdout in blocks to a pipe but line by line to a terminal: unbuffered,
    # a transcript's stdout and stderr lines interleave as the reader sees them.
    env["PYTHONUNBUFFERED"] = "1"
    env["SCOUT_BOOTSTRAP_NO_INSTALL"] = "1"  # scripts/*.sh: use this environment as it is
    return env


def elide(output: str, sandbox: Path) -> str:
    """``output`` with the sandbox's path written ``...``, as the docs write the reader's
    own working directory (``evidence records: .../scout-demo-report``)."""
    for path in sorted({str(sandbox.resolve()), str(sandbox)}, key=len, reverse=True):
        output = output.replace(path, "...")
    return output


@dataclass(frozen=True)
class DemoRun:
    """One demo command's run: what it printed, its exit code, and where it ran."""

    command: str
    output: str
    """stdout and stderr, interleaved as printed, with the sandbox's path elided."""
    returncode: int
    sandbox: Path
    """The directory it ran in; what it wrote is there (:attr:`written`)."""

    @property
    def written(self) -> list[Path]:
        """The top-level entries the run created in its sandbox (not the links)."""
        return sorted(p for p in self.sandbox.iterdir() if not p.is_symlink())


class DemoRuns:
    """Each demo command, run once per session under ``root``; :meth:`get` runs or reuses."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._runs: dict[str, DemoRun] = {}

    @staticmethod
    def split(line: str) -> tuple[str, str] | None:
        """(command, tail) of a demo command line, or None for any other line."""
        m = DEMO.match(line.strip())
        if m is None:
            return None
        return m["command"].strip(), (m["tail"] or "").strip()

    def get(self, command: str, timeout_s: float) -> DemoRun:
        """The run of ``command`` (a demo command without a tail; see :meth:`split`),
        run now, in a fresh sandbox, if this session has not run it yet."""
        if self.split(command) != (command, ""):
            raise ValueError(f"not a demo command: {command!r}")
        if command not in self._runs:
            sandbox = make_sandbox(self._root / f"run-{len(self._runs)}")
            try:
                res = subprocess.run(
                    ["bash", "-c", "exec 2>&1\n" + command],
                    check=False,
                    cwd=sandbox,
                    env=command_env(sandbox),
                    stdout=subprocess.PIPE,
                    text=True,
                    timeout=timeout_s,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired as exc:
                raise TimeoutError(f"`{command}` still running after {timeout_s:.0f} s") from exc
            self._runs[command] = DemoRun(
                command, elide(res.stdout, sandbox), res.returncode, sandbox
            )
        return self._runs[command]

    def replay(self, line: str, timeout_s: float) -> str | None:
        """A shell line that does what the demo command ``line`` does, from its one run:
        copy the files the run wrote into the working directory, print its output and
        exit with its code, through ``line``'s own redirection (``> /dev/null``). None
        when ``line`` is not a demo command."""
        parts = self.split(line)
        if parts is None:
            return None
        command, tail = parts
        run = self.get(command, timeout_s)
        output = self._root / f"{run.sandbox.name}.out"
        output.write_text(run.output, encoding="utf-8")
        copy = " ".join(shlex.quote(str(p)) for p in run.written)
        steps = [f"cp -R {copy} ." if copy else ":", f"cat {shlex.quote(str(output))}"]
        return "{ " + " && ".join([*steps, f"(exit {run.returncode})"]) + "; } " + tail
