"""``scout report PATH``: what SCOUT decided in a run, for a person or a machine.

PATH is a report directory or one rank file, read leniently: a damaged line or file is
skipped and named, the rest is shown. Output: a terminal timeline, or ``--json`` for
machines; ``--html FILE`` and ``--png DIR`` also write the pictures.

[Exit codes]
``0``: nothing in the selection reports a failure. ``1``: something does (an incident or
a verdict naming a failure), so a launcher can act on the code alone. ``2``: the report
could not be read (or a file written), an unknown ``--run-id``, or bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scout_core.vocabulary import Failure

if TYPE_CHECKING:
    from scout_core.report.timeline import Timeline

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDING", "add_arguments", "run"]

EXIT_CLEAN = 0
EXIT_FINDING = 1
EXIT_ERROR = 2
JSON_VERSION = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``scout report``."""
    parser.add_argument("path", help="a report directory, or one rank-<r>.jsonl file")
    parser.add_argument(
        "--all",
        action="store_true",
        help=(
            "also records that agree and name no failure "
            "(SCOUT writes none: a healthy round leaves no record)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--run-id", help="only this run (a directory may hold several)")
    parser.add_argument(
        "--rank",
        type=int,
        action="append",
        default=[],
        help="only records naming this rank (repeatable)",
    )
    parser.add_argument(
        "--failure",
        choices=[f.value for f in Failure],
        action="append",
        default=[],
        help="only records reporting this failure (repeatable)",
    )
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML page")
    parser.add_argument("--png", metavar="DIR", help="write the pictures as PNG files")


def _fail(message: str) -> int:
    print(f"scout report: {message}", file=sys.stderr)
    return EXIT_ERROR


def run(args: argparse.Namespace) -> int:
    """Read, select, print and draw; return the exit code (module doc)."""
    from scout_core.errors import EvidenceError
    from scout_core.records.reading import load_report
    from scout_core.report.timeline import Selection, build_timeline

    try:
        report = load_report(args.path, strict=False)
    except (EvidenceError, OSError) as exc:
        return _fail(str(exc))
    if not report.records and report.problems:
        skipped = "; ".join(str(p) for p in report.problems)
        return _fail(f"{args.path}: no readable record ({skipped})")
    if not report.files:
        return _fail(f"{args.path}: no rank files (rank-<global rank>.jsonl) here")
    if args.run_id is not None and args.run_id not in report.runs():
        return _fail(f"no run {args.run_id!r} in {args.path}; runs: {', '.join(report.runs())}")
    selection = Selection(
        run_id=args.run_id,
        ranks=frozenset(args.rank),
        failures=frozenset(Failure(f) for f in args.failure),
        include_routine=args.all,
    )
    timeline = build_timeline(report, selection)
    code = EXIT_FINDING if timeline.findings() else EXIT_CLEAN
    if args.html or args.png:
        try:
            _draw(timeline, args.html, args.png)
        except OSError as exc:
            return _fail(f"cannot write: {exc}")
    try:
        if args.json:
            print(json.dumps(_as_json(timeline, code), indent=1, allow_nan=False))
        else:
            from scout_core.report.terminal import print_timeline

            print_timeline(timeline)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (``| head``) went away: stop quietly. Point stdout at /dev/null so
        # the interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return code


def _draw(timeline: Timeline, html_path: str | None, png_dir: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: the pictures only ever go to files
    from scout_core.report.figures import render_figures

    figures = render_figures(timeline)
    if png_dir:
        out = Path(png_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, data in figures.items():
            (out / name).write_bytes(data)
        print(f"scout report: wrote {', '.join(figures)} to {out}", file=sys.stderr)
    if html_path:
        from scout_core.report.page import render_html

        Path(html_path).write_text(render_html(timeline, figures), encoding="utf-8")
        print(f"scout report: wrote {html_path}", file=sys.stderr)


def _as_json(timeline: Timeline, code: int) -> dict[str, Any]:
    report = timeline.report
    runs = []
    for run_id in report.runs():
        times = [r.time for r in report.records if r.run_id == run_id]
        runs.append(
            {
                "run_id": run_id,
                "records": len(times),
                "first_time": min(times),
                "last_time": max(times),
            }
        )
    s = timeline.selection
    return {
        "version": JSON_VERSION,
        "path": str(report.directory),
        "files": [str(p) for p in report.files],
        "runs": runs,
        "problems": [
            {"path": p.path, "line": p.line, "message": p.message} for p in report.problems
        ],
        "ranks_without_file": list(report.ranks_without_file()),
        "selection": {
            "run_id": s.run_id,
            "ranks": sorted(s.ranks),
            "failures": sorted(f.value for f in s.failures),
            "all": s.include_routine,
        },
        "sections": {
            name: [row.to_dict() for row in rows] for name, rows in timeline.sections.items()
        },
        "findings": len(timeline.findings()),
        "exit_code": code,
    }
