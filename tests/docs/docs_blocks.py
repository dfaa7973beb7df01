"""The code blocks of the README and ``docs/``: which run, which are illustrations, and how.

A fenced block in Python (``python``), shell (``bash``, ``sh``, ``shell``) or a
terminal transcript (``console``) is run by ``tests/docs/test_docs.py`` unless the
paragraph just above it (blank lines aside) starts with the visible marker::

    *Illustration, not run:* <why, optional>

Data blocks are parsed: ``json`` with :func:`json.loads` and ``toml`` with
:mod:`tomllib`, so a documented config that does not parse fails too. Other
languages (``text``, the tree in ``development.md``) are prose.

An HTML comment just above the block (under the marker, if any) tunes the run, and
stays invisible on the rendered page::

    <!-- docs-test: slow timeout=300 -->

``slow`` puts the block under the ``slow`` marker (long campaigns, run with
``-m slow``); ``timeout`` is the block's limit in seconds (default 120).

A ``console`` block is a transcript: a line starting with ``$ `` is a command and the
lines up to the next command are its documented output, compared by
:func:`output_matches`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DATA",
    "ILLUSTRATION",
    "RUN",
    "Block",
    "Command",
    "commands",
    "extract",
    "output_matches",
]

RUN = frozenset({"python", "bash", "sh", "shell", "console"})
"""Languages whose blocks run unless marked as illustrations."""
DATA = frozenset({"json", "toml"})
"""Languages whose blocks must parse unless marked as illustrations."""
ILLUSTRATION = re.compile(r"^\*Illustration, not run:\*")
"""The visible marker line above a block that is not run."""

_FENCE = re.compile(r"^(`{3,})([A-Za-z0-9_+-]*)\s*$")
_OPTIONS = re.compile(r"^<!--\s*docs-test:(?P<opts>[^>]*)-->$")


@dataclass(frozen=True)
class Block:
    """One fenced code block."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    illustration: bool
    slow: bool = False
    timeout_s: float = 120.0
    options: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path.as_posix()}:{self.line}"


def extract(path: Path, root: Path) -> list[Block]:
    """Every fenced block of ``path`` (named relative to ``root``), with its marker and options."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        end = i + 1
        while end < len(lines) and not (
            lines[end].startswith(fence) and lines[end].strip() == fence
        ):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: the code block is never closed")
        above = _lines_above(lines, i)
        options: dict[str, str] = {}
        if above and (om := _OPTIONS.match(above[0])):
            for word in om.group("opts").split():
                key, _, value = word.partition("=")
                options[key] = value
            above = above[1:]
        unknown = set(options) - {"slow", "timeout"}
        if unknown:
            raise ValueError(f"{path}:{i + 1}: unknown docs-test option(s) {sorted(unknown)}")
        blocks.append(
            Block(
                path=path.relative_to(root),
                line=i + 1,
                lang=lang,
                text="\n".join(lines[i + 1 : end]) + "\n",
                illustration=bool(above and ILLUSTRATION.match(above[0])),
                slow="slow" in options,
                timeout_s=float(options.get("timeout") or 120),
                options=options,
            )
        )
        i = end + 1
    return blocks


def _lines_above(lines: list[str], index: int) -> list[str]:
    """What sits above ``index``, nearest first: the options comment if the nearest
    non-blank line is one, then the first line of the paragraph above, so that a marker
    wrapped over several lines (as Markdown paragraphs are) still counts."""
    out: list[str] = []
    j = index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0 and _OPTIONS.match(lines[j].strip()):
        out.append(lines[j].strip())
        j -= 1
        while j >= 0 and not lines[j].strip():
            j -= 1
    if j < 0 or _FENCE.match(lines[j]):
        return out
    while j > 0 and lines[j - 1].strip() and not _FENCE.match(lines[j - 1]):
        j -= 1
    out.append(lines[j].strip())
    return out


@dataclass(frozen=True)
class Command:
    """One ``$ `` command of a transcript and the output documented under it."""

    line: str
    expected: list[str]


def commands(transcript: str) -> list[Command]:
    """Split a ``console`` block into its commands (continuation lines ending in ``\\``
    join the command) and their documented output."""
    out: list[Command] = []
    current: list[str] | None = None
    expected: list[str] = []
    continuing = False
    for raw in transcript.splitlines():
        if continuing and current is not None:
            current.append(raw)
            continuing = raw.endswith("\\")
            continue
        if raw.startswith("$ "):
            if current is not None:
                out.append(Command("\n".join(current), expected))
            current, expected = [raw[2:]], []
            continuing = raw.endswith("\\")
        elif current is not None:
            expected.append(raw)
    if current is not None:
        out.append(Command("\n".join(current), expected))
    return out


_HEX = re.compile(r"\b[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_RULE = re.compile(r"[-─━═]{2,}")
_SPACE = re.compile(r"\s+")

SIMILARITY = 0.75
"""How alike a documented output line and the run's line must be, once numbers, ids
and column padding are set aside (:func:`_normal`): the run's timings, signatures and
therefore column widths differ from the documented run, its words may not."""


def _normal(line: str) -> str:
    line = _HEX.sub("H", line)
    line = _NUMBER.sub("0", line)
    line = _RULE.sub("-", line)
    return _SPACE.sub(" ", line).strip()


def output_matches(expected: list[str], actual: str) -> str | None:
    """``None`` when the documented ``expected`` lines appear, in order, in ``actual``;
    else the first documented line that does not.

    A line ``...`` stands for any output, blank lines are ignored, and each documented
    line must match a later line of the run at :data:`SIMILARITY` or better once both
    are normalized (numbers, hex ids, rule lengths and spacing set aside).
    """
    got = [_normal(x) for x in actual.splitlines() if x.strip()]
    at = 0
    for line in expected:
        want = _normal(line)
        if not want or want == "...":
            continue
        for k in range(at, len(got)):
            if got[k] == want or difflib.SequenceMatcher(None, want, got[k]).ratio() >= SIMILARITY:
                at = k + 1
                break
        else:
            return line
    return None
