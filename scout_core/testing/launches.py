"""The launch commands an example documents, ready to run in a test.

Each example under ``examples/`` says in its module docstring how to launch it (an
indented line starting with ``torchrun``, ``deepspeed`` or ``python``). A reliability
test runs exactly those commands, so the header cannot drift from what works.
:func:`documented_launches` reads them; :func:`runnable` turns one into an argument
list for this environment: the launcher from this interpreter's environment, an
OS-chosen free port where the launcher would otherwise use a fixed one (DeepSpeed's
29500), and extra arguments (a report directory in the test's scratch folder).
"""

from __future__ import annotations

import ast
import shlex
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from scout_core.testing.harness import port_clash

__all__ = ["LAUNCHERS", "check_documented_launch", "documented_launches", "runnable"]

LAUNCHERS: tuple[str, ...] = ("torchrun", "deepspeed", "python")
"""Words a documented launch line starts with."""


def documented_launches(example: Path) -> list[str]:
    """The launch lines in ``example``'s module docstring, in order."""
    doc = ast.get_docstring(ast.parse(example.read_text(encoding="utf-8"))) or ""
    lines: list[str] = []
    for raw in doc.splitlines():  # a trailing backslash continues the command
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1].rstrip() + " " + raw.strip()
        else:
            lines.append(raw.strip())
    found = [" ".join(line.split()) for line in lines if line.split(" ", 1)[0] in LAUNCHERS]
    if not found:
        raise ValueError(f"{example}: its docstring documents no launch command")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runnable(line: str, extra: Sequence[str] = ()) -> list[str]:
    """``line`` as arguments for this environment, with ``extra`` appended."""
    args = shlex.split(line)
    bindir = Path(sys.executable).parent
    if args[0] == "python":
        args[0] = sys.executable
    elif args[0] == "torchrun":
        args[0:1] = [sys.executable, "-m", "torch.distributed.run"]
    elif args[0] == "deepspeed":
        args[0:1] = [str(bindir / "deepspeed"), "--master_port", str(_free_port())]
    return [*args, *extra]


def check_documented_launch(
    example: Path,
    index: int,
    *,
    runs: int = 5,
    cwd: Path,
    timeout_s: float = 600.0,
) -> list[str]:
    """Run ``example``'s ``index``-th documented launch ``runs`` times; every run must exit
    0 and print at least one ``SCOUT verdict:`` line, each naming the injected fault on
    the injected rank (``step S <fault> on rank R (``). Returns each run's verdict lines.

    The example path in the line is made absolute, and each run gets its own
    ``--report-dir`` under ``cwd``. Raises ``AssertionError`` naming the run that failed.
    """
    import os
    import subprocess

    line = documented_launches(example)[index]
    inject = line.split("--inject ", 1)[1].split()[0]
    kind, _, where = inject.partition(":")
    rank = int(dict(kv.split("=") for kv in where.split(","))["rank"])
    relative = f"examples/{example.parent.name}/{example.name}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    seen: list[str] = []
    for attempt in range(1, runs + 1):
        for _ in range(3):  # a launcher's free port taken meanwhile: pick another, again
            args = runnable(line.replace(relative, str(example)))
            report = cwd / f"report-{index}-{attempt}"
            shutil.rmtree(report, ignore_errors=True)
            proc = subprocess.run(
                [*args, "--report-dir", str(report)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                start_new_session=True,
            )
            if proc.returncode == 0 or not port_clash(proc.stdout + proc.stderr):
                break
        tail = (proc.stdout + proc.stderr)[-3000:]
        verdicts = [x for x in proc.stdout.splitlines() if x.startswith("SCOUT verdict:")]
        assert proc.returncode == 0, f"run {attempt} of `{line}` exited {proc.returncode}:\n{tail}"
        assert verdicts, f"run {attempt} of `{line}` named no one:\n{tail}"
        wrong = [v for v in verdicts if f" {kind} on rank {rank} (" not in v]
        assert not wrong, f"run {attempt} of `{line}`: verdicts besides the fault: {wrong}"
        seen.append("\n".join(verdicts))
    return seen
