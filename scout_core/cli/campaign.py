"""``scout campaign``: randomized fault injections across setups, scored from evidence.

The plan is drawn from ``--seed`` (:mod:`scout_core.campaign.plan`); ``--plan`` prints it
without training. Trials run one after another (:mod:`scout_core.campaign.runner`), each
scored from the evidence it wrote (:mod:`scout_core.campaign.score`); the scores go to
stdout as a table and, with ``--json``, to a file. Definitions: docs/campaign.md.

[Exit codes]
``0``: the campaign ran (whatever its scores). ``2``: bad options, or no trial could run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scout_core.campaign.plan import Trial
    from scout_core.campaign.score import TrialScore

__all__ = ["JSON_VERSION", "add_arguments", "render_table", "run"]

JSON_VERSION = 1
QUICK_TRIALS = 11
"""``--quick``: one round of the eleven kinds (ten faults and a clean control)."""
LONG_TRIALS = 132


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``scout campaign``."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn plan")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a small representative set: {QUICK_TRIALS} trials over the core setups",
    )
    parser.add_argument(
        "--trials", type=int, default=None, help=f"trials to draw (default {LONG_TRIALS})"
    )
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        help="draw only from this setup (repeatable; default: every setup)",
    )
    parser.add_argument(
        "--kind", action="append", default=[], help="draw only this fault kind (repeatable)"
    )
    parser.add_argument(
        "--out-dir",
        default="scout-campaign",
        help="where each trial's evidence goes (default ./scout-campaign)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plan", action="store_true", help="print the drawn plan; run nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _draw(args: argparse.Namespace) -> list[Trial]:
    from scout_core.campaign.plan import QUICK_SETUPS, SETUPS, draw_plan
    from scout_core.testing.trial import FAULT_KINDS

    setups = args.setup or (list(QUICK_SETUPS) if args.quick else [s.name for s in SETUPS])
    trials = args.trials or (QUICK_TRIALS if args.quick else LONG_TRIALS)
    return draw_plan(args.seed, trials=trials, setups=setups, kinds=args.kind or FAULT_KINDS)


@contextmanager
def _progress(total: int, show: bool) -> Iterator[Callable[[str], None]]:
    """An ``advance(label)`` callback over one bar on stderr (nothing when hidden)."""
    if not show:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("campaign", total=total)

        def advance(label: str) -> None:
            bar.update(task, advance=1, description=label)

        yield advance


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


_COLUMNS = (
    f"{'':<20} {'trials':>6} {'found':>5} {'err':>3} {'recall':>6} {'prec.':>6} {'exact':>6} "
    f"{'ttv s med/worst':>16} {'ttv steps':>9} {'FP/1k clean':>11}"
)


def _row(name: str, s: dict[str, Any]) -> str:
    ttv = f"{_fmt(s['ttv_s']['median'], '.2f')}/{_fmt(s['ttv_s']['worst'], '.2f')}"
    steps = f"{_fmt(s['ttv_steps']['median'], '.0f')}/{_fmt(s['ttv_steps']['worst'], '.0f')}"
    return (
        f"{name:<20} {s['trials']:>6} {s['detected']:>5} {s['errors']:>3} "
        f"{_fmt(s['recall'], '.0%'):>6} "
        f"{_fmt(s['precision'], '.0%'):>6} {_fmt(s['exact_rank'], '.0%'):>6} {ttv:>16} "
        f"{steps:>9} {_fmt(s['fp_per_1k_clean_steps'], '.1f'):>11}"
    )


def render_table(scores: Sequence[TrialScore]) -> str:
    """The score table: per fault kind, per setup, and the totals."""
    from scout_core.campaign.plan import SETUPS
    from scout_core.campaign.score import summarize
    from scout_core.testing.trial import FAULT_KINDS

    lines = [_COLUMNS]
    for title, names, key in (
        ("by fault kind", FAULT_KINDS, "kind"),
        ("by setup", [s.name for s in SETUPS], "setup"),
    ):
        lines.append(f"-- {title}")
        for name in names:
            group = [s for s in scores if getattr(s, key) == name]
            if group:
                lines.append(_row(name, summarize(group)))
    lines.append("-- total")
    lines.append(_row("all", summarize(scores)))
    return "\n".join(lines)


def _describe(score: TrialScore) -> str:
    said = "; ".join(
        f"{c.failure} on {list(c.outliers) or 'no single rank'} at step {c.step}"
        for c in score.claims
    )
    ttv = "" if score.ttv_s is None else f" after {score.ttv_s:.1f} s"
    return (
        f"{score.outcome}{ttv}"
        + (f" ({said})" if said else "")
        + (f" [{score.error}]" if score.error else "")
    )


def run(args: argparse.Namespace) -> int:
    """Draw, run, score and print; return the exit code (module doc)."""
    from scout_core.campaign.runner import run_campaign
    from scout_core.campaign.score import summarize

    try:
        plan = _draw(args)
    except ValueError as exc:
        print(f"scout campaign: {exc}", file=sys.stderr)
        return 2
    custom = args.trials or args.setup or args.kind
    mode = "quick" if args.quick else ("custom" if custom else "long")
    print(f"scout campaign: seed {args.seed}, {len(plan)} trials ({mode})")
    for t in plan:
        print(f"  plan {t.label()} ({t.steps} steps)")
    if args.plan:
        return 0
    sys.stdout.flush()
    show = not args.no_progress and sys.stderr.isatty()
    lines: list[str] = []

    def skip(setup: str, module: str) -> None:
        line = f"  skipped setup {setup}: {module} is not importable here"
        print(line, flush=True)

    with _progress(len(plan), show) as advance:

        def done(trial: Trial, score: TrialScore | None) -> None:
            advance(trial.label())
            if score is not None:
                line = f"  trial {trial.label()}: {_describe(score)}"
                lines.append(line)
                if not show:
                    print(line, flush=True)

        result = run_campaign(plan, Path(args.out_dir), on_trial=done, on_skip=skip)
    if show:  # the bar is gone; the trial lines follow it
        print("\n".join(lines))
    if not result.scores:
        print("scout campaign: no trial could run", file=sys.stderr)
        return 2
    print(f"\nscores ({len(result.scores)} trials run in {result.seconds:.0f} s):")
    print(render_table(result.scores))
    if args.json:
        payload = {
            "version": JSON_VERSION,
            "seed": args.seed,
            "mode": mode,
            "plan": [t.to_dict() for t in plan],
            "trials": [s.to_dict() for s in result.scores],
            "skipped": result.skipped,
            "seconds": result.seconds,
            "scores": {
                "total": summarize(result.scores),
                "by_kind": _by(result.scores, "kind"),
                "by_setup": _by(result.scores, "setup"),
            },
        }
        Path(args.json).write_text(json.dumps(payload, indent=1, allow_nan=False))
        print(f"wrote {args.json}")
    return 0


def _by(scores: Sequence[TrialScore], key: str) -> dict[str, Any]:
    from scout_core.campaign.score import summarize

    names = dict.fromkeys(getattr(s, key) for s in scores)
    return {n: summarize([s for s in scores if getattr(s, key) == n]) for n in names}
