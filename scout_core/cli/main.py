"""The ``scout`` command line.

``scout demo``           a small multi-rank CPU job with injected faults, and its verdicts
``scout c3-round``       one C3 round across local ranks, one of them disagreeing
``scout catalog``        build (``discover``) or inspect (``show``) an MoE shape catalog
``scout report PATH``    what SCOUT decided in a run: a timeline, ``--json``, ``--html``, ``--png``
``scout simulate LAYOUT`` grouping and C3 decisions on a large layout, no processes spawned
``scout campaign``       randomized fault injections across setups, scored from the evidence
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scout_core.cli.campaign import add_arguments as add_campaign_arguments
from scout_core.cli.report import add_arguments as add_report_arguments
from scout_core.cli.simulate import add_arguments as add_simulate_arguments

__all__ = ["main"]


def _report(args: argparse.Namespace) -> int:
    from scout_core.cli.report import run

    return run(args)


def _simulate(args: argparse.Namespace) -> int:
    from scout_core.cli.simulate import run

    return run(args)


def _campaign(args: argparse.Namespace) -> int:
    from scout_core.cli.campaign import run

    return run(args)


def _demo(args: argparse.Namespace) -> int:
    from scout_core.cli.demo import main as demo_main

    return demo_main(args.rest)


def _c3_round(args: argparse.Namespace) -> int:
    from scout_core.cli.c3_round import main as round_main

    return round_main(ranks=args.ranks, odd_rank=args.odd_rank)


def main(argv: Sequence[str] | None = None) -> int:
    from scout_core import __version__

    parser = argparse.ArgumentParser(
        prog="scout",
        description="SCOUT: name the rank behind a failure in distributed training.",
    )
    parser.add_argument("--version", action="version", version=f"scout-core {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run the multi-rank fault-localization demo on CPU")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the demo")
    p.set_defaults(func=_demo)
    p = sub.add_parser("c3-round", help="one C3 round across local ranks, printing its verdict")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--odd-rank", type=int, default=2, help="the rank that disagrees (-1: none)")
    p.set_defaults(func=_c3_round)
    p = sub.add_parser(
        "report",
        help="what SCOUT decided: a timeline, --json, --html and --png pictures",
        description="Exit code: 0 nothing reported, 1 a failure reported, 2 unreadable.",
    )
    add_report_arguments(p)
    p.set_defaults(func=_report)
    from scout_core.cli.catalog import add_parser as add_catalog

    add_catalog(sub)
    p = sub.add_parser(
        "simulate",
        help="peer groups, C3 and diagnosis of a large layout, simulated in one process",
        description='Layouts such as "TP8 PP16 DP128". Exit code: 0 every planted culprit '
        "found, 1 one was not, 2 a layout does not parse.",
    )
    add_simulate_arguments(p)
    p.set_defaults(func=_simulate)
    p = sub.add_parser(
        "campaign",
        help="randomized fault injections across setups, scored from the evidence",
        description="Trials drawn from --seed; scores: precision, recall, exact-rank "
        "accuracy, time to verdict, false positives per 1,000 clean steps. Exit code: 0 "
        "the campaign ran, 2 bad options or no trial could run.",
    )
    add_campaign_arguments(p)
    p.set_defaults(func=_campaign)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # the demo parses its own options, "--help" included
        return _demo(argparse.Namespace(rest=argv[1:]))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
