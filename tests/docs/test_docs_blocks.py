"""The transcript check itself: it accepts another honest run and rejects a wrong answer.

No command runs here. The README's documented demo is rerun on paper, with other
timings, clocks, hex ids and the table padding they bring, and must still be accepted;
wrong answers planted in it (another rank, "no" for "yes", another failure kind,
another exit code) must be rejected.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docs_blocks import (
    ANY,
    MASKS,
    Command,
    Mask,
    commands,
    expected_exit_code,
    extract,
    normalize,
    output_matches,
)

ROOT = Path(__file__).resolve().parents[2]


def _readme_demo() -> list[Command]:
    blocks = [b for b in extract(ROOT / "README.md", ROOT) if b.lang == "console"]
    steps = commands(blocks[0].text)
    assert [s.line.split()[0] for s in steps] == ["bash", ".venv/bin/scout", "echo"]
    return steps


# -- another honest run, on paper ---------------------------------------------------------
# These patterns are the test's own, written apart from docs_blocks.MASKS, so that a mask
# that grew too wide or too narrow there shows up here.


def _later_clock(m: re.Match[str]) -> str:
    h, mi, s = (int(x) for x in m.group(0).split(":"))
    t = (h * 3600 + mi * 60 + s + 7 * 3600 + 41 * 60 + 29) % 86400
    return f"{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}"


def _slower(m: re.Match[str]) -> str:
    return f"{float(m.group(1)) * 13.37:.{len(m.group(1).split('.')[1]) + 1}f}{m.group(2)}"


def _other_hex(m: re.Match[str]) -> str:
    return "".join("0123456789abcdef"[(int(c, 16) + 5) % 16] for c in m.group(0))


def _repadded(lines: list[str]) -> list[str]:
    """Pipe tables laid out again for their new cell widths, as rich lays out a run's."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        rules = [all(set(c) == {"-"} for c in row) for row in table]
        cells = [row for row, rule in zip(table, rules, strict=True) if not rule]
        widths = [max(len(row[i]) for row in cells) for i in range(len(table[0]))]
        for row, rule in zip(table, rules, strict=True):
            if rule:
                out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
            else:
                out.append(
                    "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
                )
        out.append(" " * 20)  # rich ends a table with a line of spaces
        table.clear()

    for line in lines:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if table:
            flush()
        out.append(line)
    if table:
        flush()
    return out


def _rerun(lines: list[str]) -> str:
    """What another run of the documented commands prints: the same answer, other
    timings and hex ids."""
    text = "\n".join(lines)
    text = re.sub(r"\b\d\d:\d\d:\d\d\b", _later_clock, text)
    text = re.sub(r"\b(\d+\.\d+)( ?(?:ms|s))\b", _slower, text)
    text = re.sub(r"\((\d+)x\)", lambda m: f"({int(m.group(1)) * 7 + 3}x)", text)
    text = re.sub(r"\b(?=[0-9]*[a-f])[0-9a-f]{8,}\b", _other_hex, text)
    return "\n".join(_repadded(text.splitlines())) + "\n"


def test_the_rerun_changes_what_it_should() -> None:
    # The rerun must really differ from the docs, or the test below proves nothing.
    for step in _readme_demo()[:2]:
        again = _rerun(step.expected)
        assert again != "\n".join(step.expected) + "\n"
    report = _rerun(_readme_demo()[1].expected)
    assert "18:17:13" not in report and "d22cdd5b" not in report and "604.8 ms" not in report
    assert "(1466x)" in report and "01:58:42" in report


@pytest.mark.parametrize("index", [0, 1, 2], ids=["demo", "report", "echo"])
def test_readme_demo_is_accepted_with_other_timings_and_ids(index: int) -> None:
    step = _readme_demo()[index]
    assert output_matches(step.expected, _rerun(step.expected)) is None


def test_readme_demo_is_accepted_on_another_host() -> None:
    step = _readme_demo()[1]
    again = _rerun(step.expected).replace("(vm)", "(ci-runner-7)").replace(" vm ", " ci-7 ")
    assert output_matches(step.expected, again) is None


def test_readme_documents_the_report_exit_code() -> None:
    steps = _readme_demo()
    assert [expected_exit_code(steps, i) for i in range(len(steps))] == [0, 1, 0]


# -- wrong answers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("documented", "printed"),
    [
        (["rank 3: no"], "rank 1: yes"),
        (["1"], "0"),
        (["1"], "2"),
        (
            ["  step  7  straggler     culprit: rank 2     surface: layer/layers.3/t_M"],
            "  step  7  sdc           culprit: rank 2     surface: layer/layers.3/t_M\n",
        ),
    ],
    ids=["rank-and-answer", "exit-1-for-0", "exit-1-for-2", "sdc-for-straggler"],
)
def test_a_wrong_answer_is_rejected(documented: list[str], printed: str) -> None:
    assert output_matches(documented, printed) == documented[0]


# (step index, documented text, what the planted run prints instead)
_PLANTED = [
    (0, "SDC localized to rank 1: yes", "SDC localized to rank 3: yes"),
    (0, "SDC localized to rank 1: yes", "SDC localized to rank 1: no"),
    (0, "at steps [7, 8]: yes", "at steps [7, 9]: yes"),
    (0, "other flags: 0", "other flags: 2"),
    (0, "verdicts (3)", "verdicts (4)"),
    (0, "peers: [0, 1, 2, 3]", "peers: [0, 1, 2]"),
    (0, "step  7  straggler", "step  7  hang     "),
    (1, "7 record(s)", "8 record(s)"),
    (1, "| 3    | sdc       | rank 1  |", "| 3    | sdc       | rank 2  |"),
    (1, "at steps 7-8:", "at steps 7-9:"),
    (1, "layer/layers.3/forward | 0.03 s", "layer/layers.2/forward | 0.03 s"),
    (1, "Restore (1)", "Restore (0)"),
    (1, "rank(s) 1-3", "rank(s) 1-2"),
    (2, "1", "0"),
]


@pytest.mark.parametrize(("index", "documented", "planted"), _PLANTED)
def test_a_wrong_answer_in_the_readme_demo_is_rejected(
    index: int, documented: str, planted: str
) -> None:
    step = _readme_demo()[index]
    text = "\n".join(step.expected)
    assert documented in text
    wrong = _rerun(text.replace(documented, planted, 1).splitlines())
    assert output_matches(step.expected, wrong) is not None


# -- the masks ----------------------------------------------------------------------------


@pytest.mark.parametrize("mask", MASKS, ids=[m.name for m in MASKS])
def test_each_mask_masks_its_example(mask: Mask) -> None:
    assert mask.pattern.search(mask.example), mask.name
    assert normalize([mask.example]) != [" ".join(mask.example.split())]


@pytest.mark.parametrize(
    "line",
    [
        "SDC localized to rank 1: yes; straggler localized to rank 2 at steps [7, 8]: yes",
        "peers: [0, 1, 2, 3]; other flags: 0; 7 record(s); steps 7-8",
        '"observer_world": 16777216, "repeats": 7, "goal_s": 1.0',
        "128x128/e8  2048  18  99.12%  0; rows 15x8, 16x8",
        "(8 steps) 3,072 6 KiB 3.0 MiB",
        "sdc on rank 2 (rank, surface layer/blocks.1/forward, peers [0, 1, 2, 3])",
    ],
)
def test_what_carries_the_answer_is_not_masked(line: str) -> None:
    assert normalize([line]) == [" ".join(line.split())]


def test_a_time_column_is_masked_only_under_its_header() -> None:
    head = "model  ranks  group ms  found"
    documented = [head, "A      3,072  2.2       yes"]
    assert output_matches(documented, f"{head}\nA  3,072  145.2  yes\n") is None
    assert output_matches(documented, f"{head}\nA  3,071  2.2  yes\n")
    assert output_matches(documented, f"{head}\nA  3,072  2.2  no\n")
    # Without the header above it, a number in that place is an answer like any other.
    assert output_matches(documented[1:], "A  3,072  145.2  yes\n")


def test_dots_stand_for_any_output_and_order_counts() -> None:
    assert output_matches(["a", ANY, "c"], "a\nb\nb\nc\n") is None
    assert output_matches(["c", "a"], "a\nc\n") == "a"
    assert output_matches(["a"], "a b\n") == "a"  # a documented line is a whole line


def test_every_documented_transcript_accepts_itself() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for page in pages for b in extract(page, ROOT) if b.lang == "console"]
    assert blocks
    for block in blocks:
        for step in commands(block.text):
            shown = [x for x in step.expected if x.strip() != ANY]
            assert output_matches(step.expected, "\n".join(shown)) is None, block.id


def test_an_echo_that_shows_no_code_is_an_error() -> None:
    steps = [Command("false", []), Command("echo $?", ["yes"])]
    with pytest.raises(ValueError, match="not one code"):
        expected_exit_code(steps, 0)
