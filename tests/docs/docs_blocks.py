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
:func:`output_matches`: exactly, but for the values that differ between two honest runs
(timings, clocks, ids: :data:`MASKS`, :data:`COLUMNS`). A command exits 0 unless an
``echo $?`` just after it documents another code (:func:`expected_exit_code`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ANY",
    "COLUMNS",
    "DATA",
    "ILLUSTRATION",
    "MASKS",
    "RUN",
    "Block",
    "Column",
    "Command",
    "Mask",
    "commands",
    "expected_exit_code",
    "extract",
    "normalize",
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


# [What a transcript may differ in]
# A documented transcript is one real run and the test's run is another. What differs
# between two honest runs is masked, each kind by a named pattern below (MASKS, and
# COLUMNS for the cells of a table column): timings, wall clock times, signatures and
# ids, the host name, package versions, and the padding and rule lengths a table takes
# from them. Everything else must be the same once runs of spaces are collapsed: the
# numbers that carry the answer (ranks, steps, counts, exit codes, peer lists) and every
# word (yes/no, sdc/straggler/hang ...). There is no similarity threshold: a line that
# reads "rank 1: yes" where the docs say "rank 3: no" is a different answer.


@dataclass(frozen=True)
class Mask:
    """One kind of value that differs from run to run, found anywhere in a line."""

    name: str
    pattern: re.Pattern[str]
    replacement: str
    """What a match is written as (may refer to the pattern's groups)."""
    example: str
    """A value from a documented transcript that the pattern masks."""


MASKS: tuple[Mask, ...] = (
    # First, so that the digits of a long float are not read as a hex id.
    Mask(
        "float repr",  # a measured float printed with all its digits (benchmarks' JSON)
        re.compile(r"\b\d+\.\d{6,}(?:e[-+]?\d+)?\b|\b\d+(?:\.\d+)?e[-+]\d+\b"),
        "<float>",
        "0.10058192299766233, 2.786499862850178e-05",
    ),
    Mask("clock", re.compile(r"\b\d{2}:\d{2}:\d{2}\b"), "<clock>", "18:17:13"),
    Mask(
        "duration",
        re.compile(r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|s|min)\b"),
        "<duration>",
        "after 9.5s, 0.03 s, 604.8 ms",
    ),
    Mask("ratio", re.compile(r"\(\d+(?:\.\d+)?x\)"), "(<ratio>)", "(209x)"),
    Mask(
        "hex id",  # signatures and incident ids: 16 hex digits, or 8 or more with a letter
        re.compile(r"\b(?:[0-9a-f]{16}|(?=[0-9]*[a-f])[0-9a-f]{8,})\b"),
        "<hex>",
        "d22cdd5b, incident 3400f1e8ee4665b1",
    ),
    Mask(
        "host",  # the machine's name after the rank it ran
        re.compile(r"(\brank \d+ )\([^()\s,]+\)"),
        r"\1(<host>)",
        "SDC on rank 1 (vm) at step 3",
    ),
    Mask(
        "version",  # the packages of the reader's environment
        re.compile(r"\b(torch|CUDA|Triton) [^\s,]+"),
        r"\1 <version>",
        "torch 2.13.0+cpu, CUDA None",
    ),
    Mask(
        "rule",  # a table's rules and a progress bar, as long as their column
        re.compile(r"[-─━═]{3,}"),
        "-",
        "|----------|------|",
    ),
)
"""The values masked anywhere in a line, in the order they are applied."""


@dataclass(frozen=True)
class Column:
    """A table column whose cells differ from run to run, named by its header cell."""

    name: str
    header: re.Pattern[str]
    """Matches the whole header cell."""
    value: re.Pattern[str]
    """Matches a whole cell below it that is masked (others, such as ``-``, stay)."""
    replacement: str


COLUMNS: tuple[Column, ...] = (
    # `scout report`'s host column ("vm"; "-" for the gate's rows).
    Column("host", re.compile(r"host"), re.compile(r"(?![-─━═]+$)\S+"), "<host>"),
    # A column of plain numbers whose header names a unit of time (`scout simulate`'s
    # "group ms", "diagnose ms").
    Column(
        "time column",
        re.compile(r"[A-Za-z][A-Za-z /]*\s(?:ns|us|ms|s)"),
        re.compile(r"\d[\d.,]*"),
        "<duration>",
    ),
)
"""The table columns masked, in a pipe table (``| a | b |``) or one whose columns are
aligned with two spaces or more."""

ANY = "..."
"""A documented line that stands for any output."""

_PIPE_ROW = re.compile(r"^\|(.*)\|$")
_GAP = re.compile(r"\s{2,}")
_SPACE = re.compile(r"\s+")


def _cells(line: str) -> list[str] | None:
    """A table row's cells, or ``None`` for a line that is no row."""
    text = line.strip()
    if m := _PIPE_ROW.match(text):
        return [c.strip() for c in m.group(1).split("|")]
    cells = _GAP.split(text)
    return cells if len(cells) > 1 else None


def _joined(cells: list[str], like: str) -> str:
    """``cells`` as a row written the way ``like`` is (a pipe table's or an aligned one's)."""
    return f"| {' | '.join(cells)} |" if _PIPE_ROW.match(like.strip()) else "  ".join(cells)


def _mask_columns(lines: list[str]) -> list[str]:
    """``lines`` with the cells of every :data:`COLUMNS` column masked. A table starts at
    a row with such a header cell and lasts while rows have as many cells."""
    out: list[str] = []
    header: dict[int, Column] = {}
    width = 0
    for line in lines:
        cells = _cells(line)
        if cells is None:
            header = {}
        elif named := {i: c for i, x in enumerate(cells) for c in COLUMNS if c.header.fullmatch(x)}:
            header, width = named, len(cells)
        elif header and len(cells) == width:
            masked = [
                header[i].replacement if i in header and header[i].value.fullmatch(x) else x
                for i, x in enumerate(cells)
            ]
            out.append(_joined(masked, line))
            continue
        else:
            header = {}
        out.append(line)
    return out


def normalize(lines: list[str]) -> list[str]:
    """The non-blank ``lines`` with every varying value masked (:data:`MASKS`,
    :data:`COLUMNS`) and runs of spaces collapsed: what two honest runs share."""
    out = []
    for line in _mask_columns([x for x in lines if x.strip()]):
        masked = line
        for mask in MASKS:
            masked = mask.pattern.sub(mask.replacement, masked)
        out.append(_SPACE.sub(" ", masked).strip())
    return out


def output_matches(expected: list[str], actual: str) -> str | None:
    """``None`` when the documented ``expected`` lines appear, in order, in ``actual``;
    else the first documented line that does not.

    A line ``...`` stands for any output and blank lines are ignored. Every other
    documented line must equal a later line of the run once both are normalized
    (:func:`normalize`): only the values that differ between honest runs are set aside.
    """
    documented = [x for x in expected if x.strip()]
    got = normalize(actual.splitlines())
    at = 0
    for line, want in zip(documented, normalize(documented), strict=True):
        if want == ANY:
            continue
        try:
            at = got.index(want, at) + 1
        except ValueError:
            return line
    return None


def expected_exit_code(steps: list[Command], index: int) -> int:
    """The exit code the transcript documents for ``steps[index]``: what an ``echo $?``
    just after it prints, else 0. A documented ``echo $?`` that shows no single number
    is a :class:`ValueError`."""
    if index + 1 >= len(steps) or steps[index + 1].line.strip() != "echo $?":
        return 0
    shown = [x.strip() for x in steps[index + 1].expected if x.strip()]
    if len(shown) != 1 or not shown[0].isdigit():
        raise ValueError(f"`echo $?` after `{steps[index].line}` documents {shown}, not one code")
    return int(shown[0])
