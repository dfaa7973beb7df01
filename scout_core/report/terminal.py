"""The terminal view of ``scout report``: a rich timeline, incidents first.

One table per section of the :class:`~scout_core.report.timeline.Timeline`, then what
could not be read. rich is imported here, lazily from the CLI, so ``import scout_core``
stays light. Colour and width follow the terminal; piped output is plain Markdown tables,
wide enough not to wrap.
"""

from __future__ import annotations

from typing import IO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from scout_core.report.timeline import SECTIONS, Row, Timeline, clock, ttv_text

__all__ = ["print_timeline"]

_TITLES = {
    "incidents": "Incidents",
    "verdicts": "Verdicts",
    "gate": "Checkpoint gate",
    "restore": "Restore",
}
_STYLE = {"incidents": "bold red", "verdicts": "red", "gate": "cyan", "restore": "magenta"}
_PIPED_WIDTH = 220


def _table(rows: tuple[Row, ...], show_run: bool, piped: bool) -> Table:
    # Piped output is a Markdown table: plain ASCII, one row per line, pastes into a ticket.
    table = Table(box=box.MARKDOWN if piped else box.HEAVY_HEAD, header_style="bold")
    columns = ["time", "step", "what", "culprit", "host", "surface", "ttv", "evidence"]
    if show_run:
        columns.insert(0, "run")
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column in ("time", "step", "ttv"))
    for row in rows:
        r = row.record
        cells = [
            clock(r.time),
            row.step,
            row.what,
            row.culprit,
            ", ".join(r.hosts) or "-",
            r.surface,
            ttv_text(row),
            row.evidence + (f"  [incident {row.incident}]" if row.incident else ""),
        ]
        if show_run:
            cells.insert(0, r.run_id)
        table.add_row(*cells)
    return table


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich's default exits with status 1, which ``scout report`` uses for "a failure
        # was reported"; the caller ends quietly with its own code instead.
        raise BrokenPipeError


def print_timeline(timeline: Timeline, stream: IO[str] | None = None) -> None:
    """Print ``timeline`` for a person (to ``stream``, stdout by default)."""
    console = _Console(file=stream, highlight=False, markup=False, soft_wrap=False)
    if not console.is_terminal:
        console.width = _PIPED_WIDTH
    report = timeline.report
    runs = report.runs()
    header = Text(f"scout report {report.directory}", style="bold")
    header.append(
        f"  runs: {', '.join(runs) or '-'}; {len(report.files)} rank file(s), "
        f"{len(report.records)} record(s)",
        style="dim",
    )
    console.print(header)
    show_run = len(runs) > 1 or timeline.selection.run_id is not None
    shown = 0
    for name in SECTIONS:
        rows = timeline.sections.get(name, ())
        if rows:
            console.print(Text(f"{_TITLES[name]} ({len(rows)})", style=_STYLE[name]))
            console.print(_table(rows, show_run, piped=not console.is_terminal))
            shown += len(rows)
    if not shown:
        console.print("no failures recorded" + _filtered(timeline))
    missing = report.ranks_without_file()
    if missing:
        console.print(
            f"no file from rank(s) {_ranges(missing)}, named in the records' groups "
            "(a rank writes a file only once it records a decision)",
            style="dim",
        )
    if report.problems:
        console.print(f"skipped ({len(report.problems)}):", style="yellow")
        for problem in report.problems:
            console.print(f"  {problem}", style="yellow")


def _filtered(timeline: Timeline) -> str:
    s = timeline.selection
    if s.run_id or s.ranks or s.failures:
        return " (in the selection)"
    return ""


def _ranges(ranks: tuple[int, ...]) -> str:
    """``0-3, 7`` for ``(0, 1, 2, 3, 7)``."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
