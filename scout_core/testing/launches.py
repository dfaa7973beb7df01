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
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LAUNCHERS", "documented_launches", "runnable"]

LAUNCHERS: tuple[str, ...] = ("torchrun", "deepspeed", "python")
"""Words a documented launch line starts with."""


def documented_launches(example: Path) -> list[str]:
    """The launch lines in ``example``'s module docstring, in order."""
    doc = ast.get_docstring(ast.parse(example.read_text(encoding="utf-8"))) or ""
    lines = [line.strip() for line in doc.splitlines()]
    found = [line for line in lines if line.split(" ", 1)[0] in LAUNCHERS]
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
